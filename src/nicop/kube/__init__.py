"""A small level-triggered controller runtime on asyncio: client, informers, queue, leases."""
