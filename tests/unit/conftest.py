import pytest
from hypothesis import settings

from otel_verl.testing import capture_spans

# The unit tier's hypothesis profile: no per-example deadline (these tests time nothing, and on a
# loaded 2-core CI machine a scheduling stall can take a passing example past the default 200 ms,
# which hypothesis reports as a failure or as Flaky); a failure prints the @reproduce_failure
# line, so a red CI run can be replayed.
settings.register_profile("unit", deadline=None, print_blob=True)
settings.load_profile("unit")


@pytest.fixture
def spans():
    """Tracing into memory; yields the exporter."""
    with capture_spans(project_name="proj", experiment_name="exp") as exporter:
        yield exporter
