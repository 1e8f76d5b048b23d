import sys


def test_package_imports_without_comfyui():
    import comfyui_fastar

    assert isinstance(comfyui_fastar.NODE_CLASS_MAPPINGS, dict)
    assert "comfy" not in sys.modules
