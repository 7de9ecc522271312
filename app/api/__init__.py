"""REST v1 and HTML routes."""
