"""``python -m comfyui_fastar``: the same command line as ``fastar``."""

from .tools.cli import main

raise SystemExit(main())
