"""Running the roles: the worker's training loop, the ps's wait, and the hooks between them."""
