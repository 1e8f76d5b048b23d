"""Start-up shared by the scripts of tests/ that run inside a real ComfyUI (with its python, in its folder, as
``python tests/SCRIPT.py PACK_DIR``): ComfyUI on the CPU, the pack at PACK_DIR imported as ``comfyui_fastar``, as
ComfyUI's own loader would name a folder in custom_nodes/, and the checks' results printed as one ``RESULT {json}``
line for the test file to assert on (each check's figures, {"skipped": why} or {"error": traceback})."""

import importlib.util
import json
import os
import sys
import traceback


class Skip(Exception):
    """Raised by a check that needs a feature this ComfyUI lacks."""


def boot() -> str:
    """ComfyUI's arguments set for the CPU and the pack imported; returns the pack's folder."""
    pack = sys.argv[1]
    sys.path.insert(0, os.getcwd())
    sys.argv = [sys.argv[0], "--cpu"]
    from comfy.cli_args import args

    args.cpu = True
    import comfy.model_management  # noqa: F401  (reads the arguments above once, at import)

    spec = importlib.util.spec_from_file_location("comfyui_fastar", os.path.join(pack, "__init__.py"),
                                                  submodule_search_locations=[pack])
    module = importlib.util.module_from_spec(spec)
    sys.modules["comfyui_fastar"] = module
    spec.loader.exec_module(module)
    return pack


def recorder(results: dict):
    """A decorator that runs a check at once and records its outcome in ``results`` under its name."""
    def check(fn):
        try:
            results[fn.__name__] = fn()
        except Skip as e:
            results[fn.__name__] = {"skipped": str(e)}
        except Exception:
            results[fn.__name__] = {"error": traceback.format_exc()[-3000:]}
        return fn
    return check


def report(results: dict) -> None:
    print("RESULT " + json.dumps(results))
