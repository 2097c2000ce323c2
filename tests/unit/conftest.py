import pytest

from otel_verl.testing import capture_spans


@pytest.fixture
def spans():
    """Tracing into memory; yields the exporter."""
    with capture_spans(project_name="proj", experiment_name="exp") as exporter:
        yield exporter


