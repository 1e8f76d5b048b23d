"""`fastar bench launches`' counter, and what it holds the hot path to: in steady state a chunk of every cache mode
reads the device once (its report), makes no shape from data and launches at most 1.5x the window's kernels."""

import pytest
import torch

from comfyui_fastar.tools.bench import launches
from comfyui_fastar.tools.bench.op_count import H200, OpCounter, estimate
from comfyui_fastar.tools.bench.scenarios import Scenario

from helpers import tiny_context, tiny_model, tiny_modes


def test_the_counter_sees_every_kind_of_host_sync_and_no_launch_in_a_view():
    x = torch.randn(6, 8)
    counter = OpCounter()
    with counter.counting():
        y = x.t()[:, :3].unsqueeze(0).expand(4, -1, -1)  # views: nothing launched
        counter.mark()
        z = x * 2 + 1  # two kernels
        counter.mark()
        float(x.sum())  # .item()
        bool((x > 0).any())  # bool(tensor)
        x[x > 0]  # boolean-mask indexing
        x.nonzero()
        x[0].tolist()
        torch.tensor([1, 2, 3])  # host data sent to the device
        counter.mark()
        torch.mm(x, x.t())
    views, kernels, syncs, matmul = counter.stretches
    assert views.launches == 0 and y.shape == (4, 8, 3)
    assert kernels.launches == 2 and kernels.syncs == 0 and kernels.bytes == 4 * (48 + 48 + 48 + 48) and z.numel()
    assert syncs.syncs_by_kind() == {"item": 2, "boolean_mask": 1, "nonzero": 1, "tolist": 1, "host_tensor": 1}
    assert syncs.dynamic == 2  # the mask's rows and nonzero's: shapes from data
    assert matmul.flops == 2 * 6 * 6 * 8
    assert estimate(matmul)["seconds"] == pytest.approx(H200.launch_s)  # a small matmul costs its launch


def tiny_scenario() -> Scenario:
    return Scenario(name="tiny", model=tiny_model(), context=tiny_context(tokens=6, pad=10), latent_hw=(4, 6),
                    channels=16, schedule="self-forcing", quality=False)


def test_a_steady_chunk_of_every_mode_reads_the_device_once_and_makes_no_shape_from_data(one_thread):
    scenario = tiny_scenario()
    counted = {}
    for name, (spec, fastar) in tiny_modes().items():
        # (recompute's rebuild, the clean passes before each chunk, is counted with that chunk)
        steady = launches.steady_chunk(launches.count_rollout(scenario, spec, fastar, frames=24))
        counted[name] = steady
        assert steady.syncs_by_kind() == {"tolist": 1}, (name, steady.sync_sites())  # the report, one transfer
        assert steady.dynamic == 0, (name, steady.dynamic_sites())
    window = counted["dense-window"].launches
    for name, steady in counted.items():
        # AnnCA's pruning, off in every preset (it keeps every real prompt token at Wan's shapes), plans per frame
        # and is not held to the bound; AnnSA on every call (annsa_min_keys 0 here) is.
        if name != "all+annca-prune":
            assert steady.launches <= 1.5 * window, (name, steady.launches, window)


def test_the_estimate_traces_a_model_too_large_for_this_machine_under_fake_tensors(monkeypatch):
    """The estimate runs the real hot path on fake tensors (no data, no memory); here at a small width to stay
    quick, its arithmetic checked against the shapes."""
    from comfyui_fastar.fastar_core.model.wan_config import WanConfig

    real = launches.wan13b_fake_scenario

    def small(layers):
        scenario = real(layers)
        from comfyui_fastar.fastar_core.model.wan_model import WanModel

        with scenario.notes["fake_mode"]:
            default = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16)
            try:
                scenario.model = WanModel(WanConfig(dim=256, num_heads=2, num_layers=layers, ffn_dim=512))
            finally:
                torch.set_default_dtype(default)
        return scenario

    monkeypatch.setattr(launches, "wan13b_fake_scenario", small)
    window = launches.estimate_mode("dense-window", layers_total=4)
    temp = launches.estimate_mode("tempcache", layers_total=4)
    assert window["host_syncs"] == temp["host_syncs"] == 1 and window["data_dependent_shapes"] == 0
    assert 0 < window["ms_per_chunk"] < temp["ms_per_chunk"] and temp["launches"] > window["launches"]


def test_the_bench_counts_lingbot_with_its_camera_and_makes_no_wan_estimate_for_it(tmp_path, monkeypatch, one_thread):
    from comfyui_fastar.fastar_core.errors import FastARError
    from comfyui_fastar.tools.bench import scenarios
    from comfyui_fastar.tools.cli import build_parser
    from comfyui_fastar.tools.command_checks import check_bench

    def tiny_lingbot(seed, device):
        return scenarios.lingbot_scenario(seed, device, heads=2, layers=1, latent_hw=(4, 6))

    monkeypatch.setitem(launches.SCENARIOS, "lingbot", tiny_lingbot)
    report = launches.run_launches_bench(tmp_path, model="lingbot", frames=28, modes=("dense-window", "tempcache"),
                                         progress=False)
    assert report["estimate"]["modes"] == {}  # the estimate is about Wan2.1-1.3B's block
    for mode in ("dense-window", "tempcache"):
        steady = report["counts"][mode]["steady_chunk"]
        assert (steady["host_syncs"], steady["data_dependent_shapes"]) == (1, 0), mode
    assert report["counts"]["tempcache"]["launches_vs_window"] <= 1.5

    def args(what, model):  # as the command line parses them, every option at its default
        return build_parser().parse_args(["bench", what, "--model", model, "--out", str(tmp_path)])

    check_bench(args("launches", "lingbot"))
    with pytest.raises(FastARError, match="lingbot is a rollout scenario; bench pareto runs on demo or wan-shapes "
                                          r"\(and bench launches on lingbot\)"):
        check_bench(args("pareto", "lingbot"))
