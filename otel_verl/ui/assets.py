"""The viewer's page and static files: our own app.js/app.css, and the charting library's bundle
read at run time from the installed ``plotly`` package (never from a CDN, never vendored here).

Why Plotly: a well-kept charting library whose pip package ships its complete, self-contained
JavaScript bundle (``plotly/package_data/plotly.min.js``), with hover labels showing the numbers
out of the box, zoom, and no further assets to load, so both the server and the offline report
can use the very same file. Without the ``ui`` extra installed the viewer still works; the charts
are replaced by their tables.
"""

from __future__ import annotations

import importlib.util
from functools import cache
from pathlib import Path

__all__ = ["page", "plotly_js", "static"]

_HERE = Path(__file__).parent / "static"
_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
_REPORT_CSP = ("default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
               "img-src data:; font-src data:; base-uri 'none'; form-action 'none'")


@cache
def plotly_js() -> bytes | None:
    """The installed plotly package's JavaScript bundle, or None when plotly is not installed."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        bundle = Path(location) / "package_data" / "plotly.min.js"
        if bundle.is_file():
            return bundle.read_bytes()
    return None


def static(name: str) -> tuple[bytes, str] | None:
    """A static file by name: ``app.js``, ``app.css`` or ``plotly.min.js``."""
    if name == "plotly.min.js":
        bundle = plotly_js()
        return None if bundle is None else (bundle, _TYPES[".js"])
    if name not in ("app.js", "app.css"):
        return None
    path = _HERE / name
    return path.read_bytes(), _TYPES[path.suffix]


def _inline_script(code: str) -> str:
    # a script element ends at the first "</script"; our code and plotly's never hold one,
    # but make sure (the HTML parser is case-insensitive)
    return "<script>" + code.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT") \
        + "</script>"


def page(report_data: str | None, title: str = "otel-verl") -> str:
    """The HTML page: linked assets for the server; everything inline (with ``report_data``, JSON
    already escaped for a script element) for the offline report."""
    head = [
        "<!doctype html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_escape(title)}</title>", '<link rel="icon" href="data:,">',
    ]
    if report_data is None:
        head += ['<link rel="stylesheet" href="static/app.css">', "</head>", "<body>",
                 '<div id="app"></div>']
        if plotly_js() is not None:
            head.append('<script src="static/plotly.min.js"></script>')
        head.append('<script src="static/app.js"></script>')
    else:
        head += [f'<meta http-equiv="Content-Security-Policy" content="{_REPORT_CSP}">',
                 "<style>" + (_HERE / "app.css").read_text() + "</style>", "</head>", "<body>",
                 '<div id="app"></div>',
                 f'<script type="application/json" id="otel-verl-data">{report_data}</script>']
        bundle = plotly_js()
        if bundle is not None:
            head.append(_inline_script(bundle.decode("utf-8")))
        head.append(_inline_script((_HERE / "app.js").read_text()))
    head += ["</body>", "</html>"]
    return "\n".join(head)


def _escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))
