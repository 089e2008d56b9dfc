"""nicop operator: the controllers that turn policies into running components."""
