"""`uvicorn app.main:app`: the app configured from `TRAINFIT_*` environment variables."""

from app.factory import create_app

app = create_app()
