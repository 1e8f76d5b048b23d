"""Every file a user hands in, read without trusting it: a file's kind (``raw``), safetensors headers
(``safetensors_reader``), torch archives (``torch_archive``) and the pickles inside them (``pickle_scan``), small JSON
(``json_files``); the Wan2.1 layout of a checkpoint (``wan_layout``) and its loader (``wan_checkpoint``), LoRA files
(``lora``), and which family a file holds (``family_keys``, ``model_files``).

Imports: ``errors``, ``memory``, ``model``. A family's own loader lives with the family and reads through here.
"""
