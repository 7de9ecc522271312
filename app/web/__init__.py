"""The HTML pages: rendering helpers shared by the page routes (app/api/routes/pages*.py)."""
