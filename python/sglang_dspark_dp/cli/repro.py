"""``repro``: one DP step on stock SGLang and then with the draft-batch
repair, each rank's DP fields side by side."""

from __future__ import annotations

import argparse

from sglang_dspark_dp.cli import common
from sglang_dspark_dp.cli.common import EXIT_CANNOT, EXIT_FAIL, EXIT_OK


def cmd_repro(args: argparse.Namespace) -> int:
    common.quiet_sglang()
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import DRAFT_WIDTH, MAX_CAPTURE_BS
    from sglang_dspark_dp.drivers.draft import DraftDriver
    from sglang_dspark_dp.package import installed_sglang_version
    from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
        DraftDPFieldNames,
    )
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )

    api = common.load_api()
    if api is None:
        return EXIT_CANNOT
    dp, gamma = args.dp, DRAFT_WIDTH
    counts = [3 if r % 2 == 0 else 0 for r in range(dp)]
    capture = adapter.capture_sizes(MAX_CAPTURE_BS)
    print(
        f"sglang {installed_sglang_version()}: one decode step, {dp} DP ranks, EP {dp}, "
        f"per-rank requests {counts}, draft block width {gamma}\n"
    )
    names = DraftDPFieldNames.for_forward_batch(api.forward_batch_cls)

    def step(label: str) -> bool:
        graph = adapter.graph_runner(api, dp_size=dp, width=gamma, capture_bs=capture)
        print(f"--- {label}")
        ok = True
        for rank in range(dp):
            with adapter.parallel_override(
                api.get_parallel, dp_size=dp, dp_rank=rank, ep_size=dp
            ):
                driver = DraftDriver(
                    api, gamma=gamma, dp_moe_sync=True, graph=graph, names=names
                )
                path = "busy" if counts[rank] else "idle"
                try:
                    seen = driver.step(counts[rank], counts)
                except Exception as exc:
                    print(
                        f"  rank {rank} ({path}): CRASH in can_run_graph: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    ok = False
                    continue
                f = seen.fields
                dev = f.get("non_padded")
                dev_s = (
                    "None"
                    if dev is None
                    else f"{dev.value} ({str(dev.dtype).replace('torch.', '')}, "
                    f"{dev.device})"
                )
                print(
                    f"  rank {rank} ({path}): graph={'yes' if seen.admitted else 'no'}  "
                    f"original_global_num_tokens_cpu={f.get('unscaled')}  "
                    f"global_num_tokens_cpu={f.get('scaled_cpu')}  "
                    f"num_token_non_padded={dev_s}  "
                    f"num_token_non_padded_cpu={f.get('non_padded_cpu')}"
                )
        print()
        return ok

    REPAIR.uninstrument()
    stock_ok = step("stock SGLang (no plugin)")
    st = REPAIR.instrument(apply=True)
    if not st.healthy:
        return common.cannot(st.reason, "the repair cannot apply")
    fixed_ok = step(f"with sglang-dspark-dp ({REPAIR.plan.describe()})")
    print(
        f"stock: {'ok' if stock_ok else 'crashes'}; "
        f"with the plugin: {'ok' if fixed_ok else 'crashes'}"
    )
    return EXIT_OK if fixed_ok else EXIT_FAIL


def add_parser(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("repro", help="one DP step: stock vs repaired")
    common.add_dp(r, 2)
    r.set_defaults(func=cmd_repro)
