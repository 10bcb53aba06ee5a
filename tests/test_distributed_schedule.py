"""Pipeline schedules: the simulator against the bubble formulas, activations in flight, an
independent check of every dependency and of as-early-as-possible timing, check_schedule on
known-wrong orders (each caught with its teaching message), the text and the picture."""

import io

import pytest

from gpulab.distributed.schedule import (
    Schedule,
    ScheduleError,
    bubble_fraction_theory,
    bubble_ratio_theory,
    check_schedule,
    gpipe_order,
    interleaved_order,
    one_f_one_b_order,
    schedule_1f1b,
    schedule_gpipe,
    schedule_interleaved_1f1b,
    simulate_schedule,
)

SIZES = [(1, 1), (1, 4), (2, 1), (2, 2), (3, 7), (4, 2), (4, 4), (4, 8), (8, 32)]  # (p, m)
INTERLEAVED = [(2, 2, 2), (2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 8, 3), (4, 12, 4), (8, 16, 2)]


def assert_timing_follows_the_rules(s: Schedule, comm: float = 0.0):
    """Recompute every rule from the actions alone: one action at a time per stage, each
    dependency ended (plus comm across devices) before the start, and each action starting
    exactly when the later of its stage and its inputs is ready (as early as possible)."""
    p, v = s.pp_size, s.n_chunks
    end = {(a.kind, a.microbatch, a.chunk * p + a.stage): (a.end, a.stage) for a in s.actions}
    assert len(end) == len(s.actions) == 2 * p * v * s.n_microbatches
    for stage in range(p):
        free = 0.0
        for a in s.stage_actions(stage):
            k = a.chunk * p + a.stage
            deps = [("F", a.microbatch, k - 1)] if a.kind == "F" and k > 0 else []
            if a.kind == "B":
                deps.append(("F", a.microbatch, k))
                if k < p * v - 1:
                    deps.append(("B", a.microbatch, k + 1))
            ready = max([end[d][0] + (comm if end[d][1] != stage else 0.0) for d in deps],
                        default=0.0)
            assert a.start >= free - 1e-12, f"{a} overlaps the previous action on its stage"
            assert a.start == pytest.approx(max(free, ready)), f"{a} not as early as possible"
            free = a.end


# ---- the bubble, against theory --------------------------------------------------------------

@pytest.mark.parametrize("p,m", SIZES)
@pytest.mark.parametrize("make", [schedule_gpipe, schedule_1f1b], ids=["gpipe", "1f1b"])
def test_gpipe_and_1f1b_bubble_is_exactly_theory(make, p, m):
    tf, tb = 1.0, 2.0
    s = make(p, m, tf, tb)
    assert_timing_follows_the_rules(s)
    # the Megatron-LM paper, Sec. 2.2.1: t_pb = (p-1)(tf+tb), t_id = m(tf+tb)
    assert s.makespan == pytest.approx((m + p - 1) * (tf + tb), rel=1e-12)
    assert s.bubble_fraction == pytest.approx((p - 1) / (m + p - 1), rel=1e-12, abs=1e-15)
    assert s.bubble_ratio == pytest.approx((p - 1) / m, rel=1e-12, abs=1e-15)
    assert s.bubble_fraction == pytest.approx(bubble_fraction_theory(p, m), abs=1e-15)
    assert s.bubble_ratio == pytest.approx(bubble_ratio_theory(p, m), abs=1e-15)


@pytest.mark.parametrize("tb", [0.5, 1.0, 3.0])
def test_the_bubble_does_not_depend_on_the_backward_cost(tb):
    for make in (schedule_gpipe, schedule_1f1b):
        s = make(4, 6, 1.0, tb)
        assert_timing_follows_the_rules(s)
        assert s.bubble_fraction == pytest.approx(3 / 9, rel=1e-12)


@pytest.mark.parametrize("p,m,v", INTERLEAVED)
@pytest.mark.parametrize("tb", [1.0, 2.0, 3.0])
def test_interleaved_bubble_is_theory_divided_by_v(p, m, v, tb):
    tf = 1.0
    s = schedule_interleaved_1f1b(p, m, v, tf, tb)
    assert_timing_follows_the_rules(s)
    # Sec. 2.2.2: t_pb^int = (p-1)(tf+tb)/v, so bubble / ideal = (p-1)/(v m)
    assert s.makespan == pytest.approx(m * (tf + tb) + (p - 1) * (tf + tb) / v, rel=1e-12)
    assert s.bubble_ratio == pytest.approx((p - 1) / (v * m), rel=1e-12)
    assert s.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12)
    assert s.bubble_fraction == pytest.approx(bubble_fraction_theory(p, m, v), rel=1e-12)
    assert s.bubble_fraction < schedule_1f1b(p, m, tf, tb).bubble_fraction


def test_comm_latency_and_uneven_stages():
    p, m, tf, tb, comm = 4, 8, 1.0, 2.0, 0.25
    gpipe = schedule_gpipe(p, m, tf, tb, comm)
    assert_timing_follows_the_rules(gpipe, comm)
    # each of the p - 1 hops costs comm once on the way forward and once on the way back
    assert gpipe.makespan == pytest.approx((m + p - 1) * (tf + tb) + 2 * (p - 1) * comm)
    for s in (schedule_1f1b(p, m, tf, tb, comm), schedule_interleaved_1f1b(p, m, 2, tf, tb, comm)):
        assert_timing_follows_the_rules(s, comm)
        assert s.bubble_fraction > bubble_fraction_theory(p, m, s.n_chunks)
    slow = schedule_1f1b(p, m, tf=[1, 1, 2, 1])  # stage 2 is twice as slow: it sets the pace
    assert_timing_follows_the_rules(slow)
    assert slow.busy == pytest.approx([24, 24, 48, 24])
    assert slow.makespan >= m * 6
    assert slow.bubble_fraction > bubble_fraction_theory(p, m)


# ---- activations in flight -------------------------------------------------------------------

@pytest.mark.parametrize("p,m", SIZES)
def test_peak_in_flight(p, m):
    assert schedule_gpipe(p, m).peak_in_flight == [m] * p
    assert schedule_1f1b(p, m).peak_in_flight == [min(p - s, m) for s in range(p)]


@pytest.mark.parametrize("p,m,v", INTERLEAVED)
def test_interleaved_peak_in_flight_follows_megatrons_warmup(p, m, v):
    # Megatron's warm-up of (p - s - 1) * 2 + (v - 1) * p forwards, then one more in 1F1B
    want = [min((p - s - 1) * 2 + (v - 1) * p + 1, v * m) for s in range(p)]
    assert schedule_interleaved_1f1b(p, m, v).peak_in_flight == want


# ---- the reference orders --------------------------------------------------------------------

def test_one_f_one_b_order_by_hand():
    assert one_f_one_b_order(3, 4) == [
        [("F", 0), ("F", 1), ("F", 2), ("B", 0), ("F", 3), ("B", 1), ("B", 2), ("B", 3)],
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)],
    ]
    assert one_f_one_b_order(4, 2)[0] == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert gpipe_order(2, 2) == [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]] * 2


def test_interleaved_order_sends_groups_of_p_through_each_chunk():
    order = interleaved_order(2, 4, 2)
    forwards = [(mb, chunk) for kind, mb, chunk in order[0] if kind == "F"]
    assert forwards == [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
    backwards = [(mb, chunk) for kind, mb, chunk in order[0] if kind == "B"]
    assert backwards == [(0, 1), (1, 1), (0, 0), (1, 0), (2, 1), (3, 1), (2, 0), (3, 0)]
    assert order[0][:6] == [("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("F", 1, 1), ("F", 2, 0),
                            ("B", 0, 1)]  # 2 * (p - 1) + (v - 1) * p = 4 warm-up forwards


def test_order_round_trip_and_size_errors():
    s = schedule_interleaved_1f1b(4, 8, 2)
    again = simulate_schedule(s.order(), 4, 8, 2, name=s.name)
    assert again == s
    with pytest.raises(ValueError, match="multiple of pp_size"):
        interleaved_order(4, 6, 2)
    with pytest.raises(ValueError, match="n_chunks >= 2"):
        interleaved_order(4, 8, 1)
    with pytest.raises(ValueError, match="n_microbatches must be an int >= 1"):
        one_f_one_b_order(4, 0)
    with pytest.raises(ValueError, match="one positive number per stage"):
        schedule_1f1b(4, 8, tf=[1, 1, 1])
    with pytest.raises(ValueError, match="comm must be >= 0"):
        schedule_gpipe(2, 2, comm=-1)


# ---- check_schedule: the reference passes, each wrong order is caught with its lesson ---------

def test_reference_orders_pass():
    for p, m in SIZES:
        assert check_schedule(one_f_one_b_order(p, m), p, m,
                              max_in_flight=[p - s for s in range(p)]) is None
        assert check_schedule(gpipe_order(p, m), p, m) is None
    for p, m, v in INTERLEAVED:
        assert check_schedule(interleaved_order(p, m, v), p, m, v) is None


WRONG = [  # (name, order for p=2, m=2 unless given, expected message)
    ("a list too few", [[("F", 0), ("F", 1), ("B", 0), ("B", 1)]],
     "one list of actions per stage: pp_size=2 lists, got 1 lists"),
    ("not an action", [[("F", 0), ("X", 1), ("B", 0), ("B", 1)]] * 2,
     r"stage 0, position 1: \('X', 1\) is not an action"),
    ("microbatch out of range", [[("F", 0), ("F", 2), ("B", 0), ("B", 1)]] * 2,
     r"\('F', 2\) is not an action.*0 <= i < n_microbatches = 2"),
    ("a forward twice", [gpipe_order(2, 2)[0], [("F", 0), ("F", 1), ("F", 1), ("B", 0)]],
     r"stage 1 runs F1 2 times \(positions 1, 2\).*exactly once"),
    ("a backward missing", [gpipe_order(2, 2)[0], [("F", 0), ("F", 1), ("B", 0)]],
     "stage 1 never runs B1: every stage runs one forward and one backward"),
    ("backward before its own forward", [gpipe_order(2, 2)[0],
                                         [("B", 0), ("F", 0), ("F", 1), ("B", 1)]],
     r"stage 1 runs B0 \(position 0\) before F0 \(position 1\).*stored the activations"),
    ("deadlock", [[("F", 0), ("B", 0), ("F", 1), ("B", 1)],
                  [("F", 0), ("F", 1), ("B", 0), ("B", 1)]],
     r"(?s)deadlocks.*stage 0 waits at position 1 to run B0: it needs B0 from stage 1 first.*"
     r"stage 1 waits at position 1 to run F1: it needs F1 from stage 0 first"),
]


@pytest.mark.parametrize("name,order,message", WRONG, ids=[w[0] for w in WRONG])
def test_wrong_orders_are_caught_with_their_lesson(name, order, message):
    with pytest.raises(ScheduleError, match=message):
        check_schedule(order, 2, 2)
    with pytest.raises(ValueError):  # simulating it fails the same way
        simulate_schedule(order, 2, 2)


def test_too_many_in_flight_and_interleaved_mistakes():
    with pytest.raises(ScheduleError, match=r"stage 0 holds 5 microbatches in flight after F4 "
                       r"\(position 4\): F0, F1, F2, F3, F4 .*The limit is 4 \(1F1B holds at "
                       r"most p - s = 4 on stage 0\)"):
        check_schedule(gpipe_order(4, 8), 4, 8, max_in_flight=[4, 3, 2, 1])
    # one warm-up forward too many on stage 1: fine under a bound of p, not under p - s
    order = one_f_one_b_order(4, 8)
    order[1] = one_f_one_b_order(4, 8)[0]
    assert check_schedule(order, 4, 8, max_in_flight=4) is None
    with pytest.raises(ScheduleError, match="stage 1 holds 4 microbatches in flight after F3"):
        check_schedule(order, 4, 8, max_in_flight=[4, 3, 2, 1])
    # chunk 1 of microbatch 0 before chunk 0 on the only device: it waits for itself
    one_device = [[("F", 0, 1), ("F", 0, 0), ("B", 0, 1), ("B", 0, 0)]]
    with pytest.raises(ScheduleError, match=r"stage 0 waits at position 0 to run F0 \(chunk 1\):"
                       r" it needs F0 \(chunk 0\) from stage 0 first"):
        check_schedule(one_device, 1, 1, 2)
    with pytest.raises(ScheduleError, match=r"is not an action. Write \('F', i, chunk\)"):
        check_schedule([[("F", 0), ("B", 0)]], 1, 1, 2)


# ---- text and picture ------------------------------------------------------------------------

def test_text_by_hand():
    # GPipe, p=2, m=2, tf=1, tb=2: stage 1 finishes F1 at 3, then B0 3-5, B1 5-7; stage 0 runs
    # B0 5-7 and B1 7-9, idle from 2 to 5.
    assert schedule_gpipe(2, 2).text() == ("stage 0: F0 F1 .  .  .  B0    B1\n"
                                           "stage 1: .  F0 F1 B0    B1    .  .")
    s = schedule_1f1b(4, 8)
    for line, idle in zip(s.text().splitlines(), s.idle, strict=True):
        assert line.split(": ")[1].split().count(".") == idle  # one dot per idle unit of tf
    assert "F0a F1a" in schedule_interleaved_1f1b(2, 2, 2).text(unit=0.5)


def test_draw_schedule_renders_under_agg():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from gpulab.distributed.schedule_draw import draw_schedule

    for s in (schedule_1f1b(4, 8), schedule_interleaved_1f1b(4, 8, 2)):
        fig = draw_schedule(s)
        ax = fig.axes[0]
        assert len(ax.patches) == s.pp_size + len(s.actions)  # idle rows, then every action
        assert len(ax.texts) == len(s.actions)
        fig.savefig(io.BytesIO(), format="png")
    fig = Figure()
    ax = fig.subplots()
    assert draw_schedule(schedule_gpipe(2, 2), ax=ax, title="GPipe") is fig
    assert ax.get_title() == "GPipe"
