"""A whole video: user settings to a sampler (``engine``), the chunk-by-chunk loop (``sampler``), denoising
schedules and the UniPC solver (``schedule``, ``unipc``), what a rollout is conditioned on (``conditioning``,
``prompts``, ``multishot``, ``actions``, ``action_script``), and the VAE in the loop (``vae``, ``video_geometry``).

Imports: every room but ``families``.
"""
