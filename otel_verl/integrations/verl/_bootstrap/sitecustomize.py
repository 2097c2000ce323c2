"""Installs otel_verl's verl integration in processes verl starts (see ``instrumentation_env``).

``install()`` / the ``verl`` instrumentor put this directory on ``PYTHONPATH``, so every Python
process started afterwards (Ray workers, engine servers, subprocesses) runs this file at startup.
It costs next to nothing: it only adds a finder that waits for the first ``import verl``, then
imports otel_verl and calls ``install()`` (before any verl module runs), and removes itself.
Then it runs the ``sitecustomize`` this file shadows, if there is one. It never raises.
"""


def _otel_verl_bootstrap() -> None:
    import importlib.machinery
    import importlib.util
    import os
    import sys

    class _InstallOnVerlImport:
        """A meta-path finder that never finds anything; it installs otel_verl on ``import verl``."""

        def find_spec(self, fullname, path=None, target=None):
            if fullname != "verl":
                return
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            try:
                from otel_verl.integrations.verl import install

                install(propagate=True)
            except ImportError:  # an interpreter without otel_verl: nothing to do
                pass
            except Exception as exc:  # never break the process
                sys.stderr.write(f"otel_verl: verl integration not installed: {exc!r}\n")
            return

    if "verl" not in sys.modules:
        sys.meta_path.insert(0, _InstallOnVerlImport())

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
        if spec is not None and spec.loader is not None and spec.origin != __file__:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(f"otel_verl: the shadowed sitecustomize failed: {exc!r}\n")


_otel_verl_bootstrap()
del _otel_verl_bootstrap
