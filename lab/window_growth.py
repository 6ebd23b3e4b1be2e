"""How fast a stream's LLM must run for a window schedule to play without a gap: the pipeline's own WindowPlanner fed
codes at a steady speed (x real time), each window's audio out a fixed decode delay after its last code (right
context included; engine.bench.playback `window_arrivals`), played by the bench's player (`simulate_player`, 200 ms
pre-roll). Pure arithmetic, no model: per schedule, the lowest speed (to 0.01x) at which an 8 s sentence plays
without an underrun, and its windows. A decode delay that is the same for every window moves every chunk alike
and changes nothing; one that grows with the load is what this leaves out.

    python -m lab.window_growth
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from engine.bench.playback import simulate_player, window_arrivals
from engine.families.orpheus import FRAMES_PER_S, SCHEDULE as ORPHEUS
from engine.windowing import WindowSchedule

SPARK_CODES_PER_S = 50.0
DECODE_S = 0.1


def lowest_speed(schedule: WindowSchedule, codes_per_s: float, decode_s: float, seconds: float = 8.0) -> float:
    codes, rate = round(seconds * codes_per_s), 16000
    spc = round(rate / codes_per_s)
    speed = 1.0
    while speed < 5.0:
        if simulate_player(window_arrivals(schedule, codes_per_s, speed, codes, spc, decode_s), rate).underruns == 0:
            return speed
        speed = round(speed + 0.01, 2)
    return float("inf")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    spark = WindowSchedule().busy()
    orpheus = ORPHEUS.busy()
    cases = [("Spark busy (16, 24 codes, growth 2)", spark, SPARK_CODES_PER_S),
             ("Spark busy, growth 1.5", replace(spark, growth=1.5), SPARK_CODES_PER_S),
             ("Orpheus busy as in run 40 (4, 8 frames, growth 2)", replace(orpheus, first_new=4, growth=2.0),
              FRAMES_PER_S),
             ("Orpheus, 8, 8 frames, growth 1.5", replace(orpheus, growth=1.5), FRAMES_PER_S),
             ("Orpheus, 12, 12 frames, growth 1.5", replace(orpheus, first_new=12, new=12, growth=1.5), FRAMES_PER_S),
             (f"Orpheus busy ({orpheus.first_new}, {orpheus.new} frames, growth {orpheus.growth:g})", orpheus,
              FRAMES_PER_S)]
    print("| schedule | lowest speed without a gap | windows (8 s) |")
    print("|---|---|---|")
    for name, schedule, cps in cases:
        windows = len(window_arrivals(schedule, cps, 3.0, round(8 * cps), 1))
        print(f"| {name} | {lowest_speed(schedule, cps, DECODE_S):.2f}x | {windows} |")


if __name__ == "__main__":
    main()
