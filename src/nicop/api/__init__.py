"""nicop's API: pydantic models of every CRD (the single source of truth for the CRD manifests)
and the names the operator and the nodes share. `nicop.api.kinds` lists the kinds; importing
this package imports no model, so light processes (probes, the CNI shim's installer) stay light.
"""
