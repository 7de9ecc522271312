"""What the routes call: thin adapters over the estimator, the catalog and the memtest schema."""
