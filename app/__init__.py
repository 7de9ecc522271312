"""trainfit service: REST v1, HTML pages and storage around the estimator library.

`create_app(settings)` builds the FastAPI application; `serve(host, port, database_url)` runs it.
"""

from app.factory import create_app
from app.settings import Settings

__all__ = ["Settings", "create_app"]
