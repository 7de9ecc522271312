"""The service's jinja2 pages (`*.html`), a package so that the wheel ships them and
`app.templating` finds them by import, installed or editable."""
