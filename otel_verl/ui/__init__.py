"""The local viewer: ``otel-verl ui`` (a web app over the store's index) and ``otel-verl report``
(the same views as one self-contained HTML file). See docs/ui.md."""

from __future__ import annotations

from otel_verl.ui.report import write_report
from otel_verl.ui.server import UIServer, serve

__all__ = ["UIServer", "serve", "write_report"]
