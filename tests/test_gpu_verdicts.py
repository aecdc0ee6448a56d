"""Tier 1: the GPU verdict rules (tracer/analysis/rules/gpu.py; their store:
tracer/analysis/gpu_store.py) on synthetic event streams.

gpu_oom needs failed device allocations *and* a non-zero exit or an abort of that process; a
recovered GPU OOM is an event, not a verdict; device_reset needs a lost GPU / Xid 79 near the
exit of a GPU process; Xid 31/43 are application faults, never an OOM.
"""

from __future__ import annotations

import signal

from tests.streams import (
    GiB,
    exit_code,
    gpu_call,
    gpu_fail,
    gpu_lib,
    gpu_lost,
    gpu_proc,
    gpu_recovered,
    gpu_sample,
    judge,
    killed,
    one,
    oom,
    oom_killer_sigkill,
    sent,
    xid,
)
from tracer.analysis.analyzer import DEVICE_RESET, GPU_OOM
from tracer.analysis.gpu_store import PER_PID, GpuStore
from tracer.events import SI_TKILL, Event, from_record
from tracer.outputs.text import describe_gpu


def test_cause_names_match_the_verdict_module() -> None:
    # gpu.py cannot import verdicts.py (the other way round): the strings must agree
    v = one(gpu_fail(1.0, 100), exit_code(1.5, 100, 1))
    assert v.cause == GPU_OOM == "gpu_oom"
    v = one(gpu_lib(0.5, 100), xid(1.0, 79), exit_code(1.5, 100, 1))
    assert v.cause == DEVICE_RESET == "device_reset"


# -- gpu_oom ---------------------------------------------------------------------------------


def test_failure_then_abort_is_gpu_oom() -> None:
    v = one(
        gpu_fail(1.0, 100, requested=2 * GiB, held=78 * GiB),
        sent(1.001, 100, 100, signal.SIGABRT, comm="app", code=SI_TKILL),
        killed(1.002, 100, signal.SIGABRT, core=True),
    )
    assert (v.cause, v.confidence, v.signal, v.pid) == ("gpu_oom", "high", "SIGABRT", 100)
    assert "cuMemAlloc_v2 of 2.0 GiB with 78.0 GiB already held" in v.summary
    assert "aborted (SIGABRT)" in v.summary
    assert v.peak_bytes == 78 * GiB
    assert v.disagreements == ()
    assert [what for _, what in v.evidence] == [
        "[uprobe] cuMemAlloc_v2 of 2.0 GiB returned CUDA_ERROR_OUT_OF_MEMORY with 78.0 GiB held",
        "SIGABRT raised by the process itself",
        "pid 100 (app) killed by SIGABRT (core dumped)",
    ]


def test_abort_without_a_signal_event_still_counts_as_its_own_doing() -> None:
    v = one(gpu_fail(1.0, 100), killed(1.002, 100, signal.SIGABRT))
    assert (v.cause, v.signal) == ("gpu_oom", "SIGABRT")


def test_failure_then_exit_1_is_gpu_oom_with_nvml_picture() -> None:
    v = one(
        gpu_sample(0.5, used=79 * GiB),
        gpu_proc(0.5, 100, used=60 * GiB),
        gpu_fail(1.0, 100, requested=2 * GiB, held=60 * GiB),
        exit_code(1.2, 100, 1),
    )
    assert (v.cause, v.confidence, v.exit_code) == ("gpu_oom", "high", 1)
    assert (v.limit_bytes, v.usage_bytes, v.peak_bytes) == (80 * GiB, 79 * GiB, 60 * GiB)
    assert "NVML: GPU 0 (Fake GPU) had 79.0 GiB of 80.0 GiB in use" in v.summary
    assert "other processes held 19.0 GiB" in v.advice
    assert any(w.startswith("[nvml] this process used 60.0 GiB") for _, w in v.evidence)


def test_free_memory_larger_than_the_request_is_reported_as_a_disagreement() -> None:
    v = one(gpu_sample(0.5, used=40 * GiB), gpu_fail(1.0, 100), exit_code(1.2, 100, 1))
    assert v.cause == "gpu_oom"
    assert any("more than the 2.0 GiB asked for" in d for d in v.disagreements)


def test_every_failure_counts_and_the_last_one_is_described() -> None:
    v = one(
        gpu_fail(1.0, 100, function="cuMemAllocAsync", failures=1),
        gpu_fail(1.1, 100, function="cuMemCreate", requested=GiB, failures=2),
        exit_code(1.5, 100, 3),
    )
    assert v.cause == "gpu_oom"
    assert "2 device allocations failed (last: cuMemCreate of 1.0 GiB" in v.summary


def test_success_after_the_last_failure_lowers_confidence() -> None:
    v = one(gpu_fail(1.0, 100), gpu_recovered(1.1, 100), exit_code(2.0, 100, 1))
    assert (v.cause, v.confidence) == ("gpu_oom", "medium")
    assert "it had recovered before it ended" in v.disagreements[0]


def test_a_failure_long_before_the_exit_is_medium_even_when_nvml_shows_the_device_full() -> None:
    # (issue 24, case 5: the NVML reading lifted a verdict with a disagreement to high)
    v = one(gpu_fail(1.0, 100), exit_code(40.0, 100, 1))
    assert (v.cause, v.confidence) == ("gpu_oom", "medium")
    assert "39 s before the exit" in v.disagreements[0]
    v = one(gpu_sample(0.9, used=79 * GiB), gpu_fail(1.0, 100), exit_code(40.0, 100, 1))
    assert (v.cause, v.confidence) == ("gpu_oom", "medium")
    assert "39 s before the exit" in v.disagreements[0]


def test_failures_of_an_earlier_process_with_the_same_pid_do_not_count() -> None:
    first, second = judge(
        gpu_fail(1.0, 100),
        exit_code(1.5, 100, 1),
        exit_code(9.0, 100, 1, start=5.0),
    )
    assert (first.cause, second.cause) == ("gpu_oom", "app_exit")


def test_killed_by_another_process_after_failures_is_a_signal_kill() -> None:
    v = one(
        gpu_fail(1.0, 100),
        sent(2.0, 200, 100, signal.SIGKILL, comm="kill"),
        killed(2.01, 100, signal.SIGKILL),
    )
    assert (v.cause, v.sender_pid) == ("signal_kill", 200)


def test_a_kernel_oom_kill_wins_over_gpu_failures() -> None:
    v = one(
        gpu_fail(1.0, 100),
        oom_killer_sigkill(2.0, 100, 101),
        oom(2.0, 100, trigger=101),
        killed(2.01, 100, signal.SIGKILL),
    )
    assert v.cause == "cgroup_oom"


# -- recovered GPU OOM: an event, not a verdict --------------------------------------------


def test_recovered_gpu_oom_then_exit_0_is_app_exit() -> None:
    v = one(gpu_fail(1.0, 100), gpu_recovered(1.1, 100), exit_code(2.0, 100, 0))
    assert (v.cause, v.exit_code, v.confidence) == ("app_exit", 0, "high")
    assert "recovered GPU OOM: 1 device allocation failed and 1 later allocation succeeded" in (
        v.summary
    )


def test_recovered_gpu_oom_of_a_running_process_gives_no_verdict() -> None:
    assert judge(gpu_lib(0.5, 100), gpu_fail(1.0, 100), gpu_recovered(1.1, 100)) == []


# -- device_reset ----------------------------------------------------------------------------


def test_xid_79_around_the_exit_of_a_gpu_process_is_device_reset() -> None:
    v = one(gpu_lib(0.5, 100), xid(5.0, 79), exit_code(6.0, 100, 1))
    assert (v.cause, v.confidence) == ("device_reset", "medium")
    assert "Xid 79 on 0000:3b:00: GPU has fallen off the bus" in v.summary


def test_two_independent_reports_make_device_reset_high() -> None:
    v = one(
        gpu_lib(0.5, 100),
        xid(5.0, 79, source="nvml", index=0),
        gpu_lost(5.5),
        killed(6.0, 100, signal.SIGSEGV),
    )
    assert (v.cause, v.confidence, v.signal) == ("device_reset", "high", "SIGSEGV")


def test_device_reset_wins_over_allocation_failures_and_says_so() -> None:
    v = one(gpu_fail(4.0, 100), xid(5.0, 79), exit_code(6.0, 100, 1))
    assert v.cause == "device_reset"
    assert v.disagreements == ("this process also had GPU allocation failures",)


def test_xid_79_naming_the_process_is_enough_without_other_gpu_evidence() -> None:
    v = one(xid(5.0, 79, pid=100), exit_code(6.0, 100, 1))
    assert v.cause == "device_reset"


def test_xid_79_near_a_process_that_uses_no_gpu_is_not_its_cause() -> None:
    v = one(xid(5.0, 79), exit_code(6.0, 100, 1))
    assert v.cause == "app_exit"


def test_xid_79_long_before_the_exit_is_not_its_cause() -> None:
    v = one(gpu_lib(0.5, 100), xid(5.0, 79), exit_code(30.0, 100, 1))
    assert v.cause == "app_exit"


def test_a_lost_gpu_is_not_the_cause_of_a_clean_exit() -> None:
    v = one(gpu_lib(0.5, 100), gpu_lost(5.0), exit_code(6.0, 100, 0))
    assert (v.cause, v.exit_code) == ("app_exit", 0)


def test_a_lost_gpu_the_process_does_not_use_is_not_its_cause() -> None:
    # NVML lists the process on GPU 1; GPU 0 was lost
    v = one(gpu_proc(0.5, 100, GiB, index=1), gpu_lost(5.0, index=0), exit_code(6.0, 100, 1))
    assert v.cause == "app_exit"
    v = one(gpu_proc(0.5, 100, GiB, index=0), gpu_lost(5.0, index=0), exit_code(6.0, 100, 1))
    assert v.cause == "device_reset"


# -- Xid 31/43: application faults, never OOM ------------------------------------------------


def test_xid_31_is_an_application_fault_not_an_oom() -> None:
    v = one(gpu_lib(0.5, 100), xid(5.0, 31, pid=100), exit_code(5.5, 100, 1))
    assert (v.cause, v.exit_code) == ("app_exit", 1)
    assert "GPU fault of its own: Xid 31" in v.summary
    assert "compute-sanitizer" in v.advice


def test_xid_43_then_abort_is_an_application_fault() -> None:
    v = one(
        xid(5.0, 43, pid=100),
        sent(5.1, 100, 100, signal.SIGABRT, comm="app", code=SI_TKILL),
        killed(5.2, 100, signal.SIGABRT),
    )
    assert (v.cause, v.signal) == ("app_exit", "SIGABRT")
    assert "Xid 43" in v.summary


def test_xid_31_of_another_process_says_nothing_about_this_one() -> None:
    v = one(gpu_lib(0.5, 100), xid(5.0, 31, pid=999), exit_code(5.5, 100, 1))
    assert v.cause == "app_exit"
    assert "Xid" not in v.summary


def test_xid_31_never_makes_a_gpu_oom_and_an_oom_is_still_an_oom() -> None:
    for number in (31, 43):
        v = one(xid(5.0, number, pid=100), exit_code(5.5, 100, 1))
        assert v.cause != "gpu_oom"
    v = one(gpu_fail(4.9, 100), xid(5.0, 31, pid=100), exit_code(5.5, 100, 1))
    assert v.cause == "gpu_oom"


# -- plumbing --------------------------------------------------------------------------------


# -- CUDA could not start ---------------------------------------------------------------------


def test_cuinit_failing_then_exit_1_names_the_failure() -> None:
    v = one(
        gpu_call(1.0, 100, "cuInit", 803),
        gpu_call(1.001, 100, "cuMemAlloc_v2", 3, failures=2, requested=GiB),
        exit_code(1.2, 100, 1),
    )
    assert (v.cause, v.confidence, v.exit_code) == ("app_exit", "high", 1)
    assert v.summary == (
        "CUDA could not initialise: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (cuInit returned 803), "
        "then it exited with code 1"
    )
    assert "does not match the kernel driver" in v.advice
    texts = [text for _, text in v.evidence]
    assert texts[:2] == [
        "[uprobe] cuInit returned CUDA_ERROR_SYSTEM_DRIVER_MISMATCH (803)",
        "[uprobe] cuMemAlloc_v2 of 1.0 GiB returned CUDA_ERROR_NOT_INITIALIZED (3)",
    ]


def test_a_context_failing_is_named_and_a_clean_exit_says_it_ran_without_the_gpu() -> None:
    v = one(gpu_call(1.0, 100, "cuDevicePrimaryCtxRetain", 804), exit_code(1.2, 100, 0))
    assert (v.cause, v.exit_code) == ("app_exit", 0)
    assert v.summary == (
        "CUDA could not initialise: CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE "
        "(cuDevicePrimaryCtxRetain returned 804), then it exited with code 0: it ran without "
        "the GPU"
    )
    assert "/usr/local/cuda/compat" in v.advice


def test_an_unnamed_code_is_shown_as_its_number() -> None:
    v = one(gpu_call(1.0, 100, "cuInit", 12345), exit_code(1.2, 100, 2))
    assert v.summary.startswith("CUDA could not initialise: CUresult 12345 (cuInit returned")


def test_failing_allocations_alone_are_not_a_start_failure() -> None:
    # not initialised, without the cuInit failure seen: nothing GPU decides this exit
    v = one(gpu_call(1.0, 100, "cuMemAlloc_v2", 3, requested=GiB), exit_code(1.2, 100, 1))
    assert v.cause == "app_exit"
    assert "CUDA could not initialise" not in v.summary


def test_a_process_killed_by_another_after_cuinit_failed_is_a_signal_kill() -> None:
    v = one(
        gpu_call(1.0, 100, "cuInit", 100),
        sent(1.1, 200, 100, signal.SIGTERM),
        killed(1.2, 100, signal.SIGTERM),
    )
    assert v.cause == "signal_kill"


def test_a_start_failure_loop_is_counted_past_what_is_kept() -> None:
    events: list[Event] = [
        gpu_call(1.0 + i / 1000, 100, "cuInit", 999, failures=i + 1) for i in range(64)
    ]
    v = one(*events, exit_code(2.0, 100, 1))
    assert "CUDA_ERROR_UNKNOWN" in v.summary
    assert any("64 failing driver calls in all" in text for _, text in v.evidence)
    # the first failure (the cause) is shown, and the last ones
    assert any(ts == 1_000_000_000 for ts, _ in v.evidence)


def test_verdicts_survive_the_trace_format() -> None:
    stream: list[Event] = [
        gpu_lib(0.5, 100),
        gpu_sample(0.6, used=79 * GiB),
        gpu_fail(1.0, 100),
        exit_code(1.5, 100, 1),
        gpu_fail(2.0, 101),
        gpu_recovered(2.1, 101),
        exit_code(3.0, 101, 0),
        gpu_lib(3.5, 102),
        xid(4.0, 79, source="nvml", index=0),
        gpu_lost(4.1),
        exit_code(4.5, 102, 1),
    ]
    live = judge(*stream)
    replayed = judge(*(from_record(e.to_record()) for e in stream))
    assert [v.cause for v in live] == ["gpu_oom", "app_exit", "device_reset"]
    assert [v.to_json() for v in replayed] == [v.to_json() for v in live]


def test_the_store_is_bounded_per_pid() -> None:
    store = GpuStore()
    for i in range(3 * PER_PID):
        store.add(gpu_fail(i / 1000, 100, failures=i + 1))
    assert len(store.by_pid[100].failures) == PER_PID
    # the count comes from the kernel's own counter when the store dropped some
    v = one(*(gpu_fail(i / 1000, 100, failures=i + 1) for i in range(300)), exit_code(1, 100, 1))
    assert "300 device allocations failed" in v.summary


def test_timeline_lines_for_gpu_events() -> None:
    assert describe_gpu(gpu_fail(1.0, 100, requested=2 * GiB, held=70 * GiB)) == (
        "gpu     pid 100 (app) cuMemAlloc_v2 of 2.0 GiB: CUDA_ERROR_OUT_OF_MEMORY with "
        "70.0 GiB held (failure 1 in a row) [uprobe]"
    )
    assert describe_gpu(gpu_recovered(1.1, 100)) == (
        "gpu     pid 100 (app) recovered GPU OOM: cuMemAlloc_v2 of 1.0 GiB succeeded after "
        "1 failure [uprobe]"
    )
    assert describe_gpu(gpu_lib(0.5, 100)) == (
        "gpu     pid 100 maps /usr/lib/x86_64-linux-gnu/libcuda.so.1: 1/8 allocation entry "
        "points probed"
    )
    assert describe_gpu(xid(5.0, 79, pid=100)) == (
        "xid     Xid 79 on 0000:3b:00: GPU has fallen off the bus (pid 100, app) [kmsg]"
    )
    assert describe_gpu(gpu_lost(5.0)) == "gpu     GPU GPU-fake-0000: GPU is lost [nvml]"
    assert describe_gpu(gpu_sample(1.0, used=GiB)) is None
    assert describe_gpu(exit_code(1.0, 100, 0)) is None
