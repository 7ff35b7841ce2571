"""StageClock: seconds per stage, and the rest of the TTFT given to the first token's stage."""
import time

import pytest

from workers.engines.stages import FIRST_TOKEN, FUSION, LAYOUT, LOAD_WAIT, LOOKUP, PLAN, StageClock


def test_stages_add_up_and_the_first_token_gets_the_rest() -> None:
    clock = StageClock()
    clock.add(LAYOUT, 0.01)
    clock.add(LAYOUT, 0.02)
    clock.add_fusion(0.5, lookup_s=0.1, load_wait_s=0.15)
    stages = clock.until_first_token(1.0)
    assert stages[LAYOUT] == pytest.approx(0.03)
    assert (stages[LOOKUP], stages[LOAD_WAIT], stages[FUSION]) == pytest.approx((0.1, 0.15, 0.25))
    assert stages[FIRST_TOKEN] == pytest.approx(0.47)
    assert sum(stages.values()) == pytest.approx(1.0)
    # Stages timed longer than the TTFT handed in (clocks read apart) never leave a negative rest.
    assert clock.until_first_token(0.1)[FIRST_TOKEN] == 0.0


def test_a_timed_block_counts_its_wall_time_even_when_it_raises() -> None:
    clock = StageClock()
    with pytest.raises(RuntimeError), clock.timed(PLAN):
        time.sleep(0.02)
        raise RuntimeError("store down")
    assert clock.seconds[PLAN] >= 0.02


def test_an_unknown_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown stage 'tokenize'"):
        StageClock().add("tokenize", 0.1)
