"""cutline.spark.quiet.progress_bar_muted with runs that overlap on one session (two
p.run(spark=session) on threads): the bar stays muted until the last one ended, then
writes to its console again (it was given the first run's null stream back for good: the
user's session showed no progress bar ever after)."""

from __future__ import annotations

from types import SimpleNamespace as NS

from cutline.spark.quiet import progress_bar_muted


class _Field:
    """The bar's ``console`` field, as Java reflection gives it."""

    def __init__(self) -> None:
        self.value = "stderr"

    def setAccessible(self, flag: bool) -> None:  # noqa: N802 - Java's name
        pass

    def get(self, bar: object) -> str:
        return self.value

    def set(self, bar: object, value: str) -> None:
        self.value = value


def _context(field: _Field, drawn: bool = True) -> NS:
    bar = NS(getClass=lambda: NS(getDeclaredField=lambda name: field))
    shown = NS(isDefined=lambda: drawn, get=lambda: bar)
    io = NS(PrintStream=lambda out: "nowhere", OutputStream=NS(nullOutputStream=lambda: None))
    return NS(_jsc=NS(sc=lambda: NS(progressBar=lambda: shown)), _jvm=NS(java=NS(io=io)))


def test_runs_that_overlap_on_one_session_give_the_bar_back_once_all_ended():
    field = _Field()
    sc = _context(field)
    session = NS(sparkContext=sc)
    first, second = progress_bar_muted(session), progress_bar_muted(sc)
    assert first.__enter__() is True and field.value == "nowhere"
    assert second.__enter__() is True and field.value == "nowhere"
    first.__exit__(None, None, None)
    assert field.value == "nowhere"  # the second run still runs: still muted
    second.__exit__(None, None, None)
    assert field.value == "stderr"
    with progress_bar_muted(session) as muted:  # and again, alone
        assert muted and field.value == "nowhere"
    assert field.value == "stderr"


def test_a_session_without_a_bar_is_left_alone():
    field = _Field()
    with progress_bar_muted(_context(field, drawn=False)) as muted:
        assert muted is False and field.value == "stderr"
    with progress_bar_muted(object()) as muted:  # not a Spark session at all
        assert muted is False


def test_the_local_executors_running_tasks_are_counted_until_their_threads_end(spark):
    """Spark's status tracker may count no task while a cancelled one still runs its
    completion listeners; the local executor's threads say whether one runs (CI's one
    failure: the user's session stopped under such a task logged Java frames)."""
    import threading
    import time

    from cutline.spark.quiet import local_task_threads

    sc = spark.sparkContext
    assert local_task_threads(sc) == 0

    def slow(part):
        time.sleep(4)
        return [len(list(part))]

    done = threading.Event()
    job = threading.Thread(target=lambda: (sc.parallelize(range(4), 2).mapPartitions(slow)
                                           .collect(), done.set()))
    job.start()
    counts = []
    while not done.is_set():
        counts.append(local_task_threads(sc))
        time.sleep(0.2)
    job.join()
    assert max(counts) == 2, counts  # both tasks, while they ran
    assert local_task_threads(sc) == 0  # and none once the job returned
