"""The sizing ladder and its verdict (pure: no engine)."""
from bench.task_sizing import LADDER, climb_verdict, ladder


def test_the_ladder_climbs_and_fits_distractors_into_few_chunks() -> None:
    settings = ladder("multi_key", 0.5)
    assert [(s.num_chunks, s.context_tokens) for s in settings] == list(LADDER)
    assert settings[0].num_distractors == 1  # two chunks: one for the asked key, one for a distractor
    assert settings[-1].num_distractors == 3
    assert [s.context_tokens for s in settings] == sorted(s.context_tokens for s in settings)


def test_the_verdict_names_the_hardest_passing_setting_and_where_reuse_loses() -> None:
    points = [
        {"setting": "a", "full_prefill": 0.9, "full_reuse": 0.85},
        {"setting": "b", "full_prefill": 0.7, "full_reuse": 0.5},
        {"setting": "c", "full_prefill": 0.4, "full_reuse": 0.1},  # reuse loses, but prefill fails: not counted
    ]
    verdict = climb_verdict("chain", points, floor=0.6, reuse_gap=0.15)
    assert verdict == {"family": "chain", "hardest_passing": "b", "reuse_loses": ["b"]}
    assert climb_verdict("chain", points[2:], 0.6, 0.15)["hardest_passing"] is None
