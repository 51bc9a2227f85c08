"""toolbus package."""
