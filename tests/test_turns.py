"""tests/turns.py: a serial test waits for the other worker's current test and then runs alone, a stream of
shared tests cannot starve it, and serial tests are sorted last. Two Turns on one folder stand for two workers (flock
locks belong to each open file, so two in one process exclude each other as two processes would)."""
import threading
import time

from tests.turns import Turns, serial_last

WAIT_S = 0.3
"""Long enough for a thread that is free to go to have gone."""


def in_thread(work) -> threading.Thread:
    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    return thread


def test_a_serial_test_waits_for_the_running_test_then_runs_alone(tmp_path):
    worker_a, worker_b = Turns(tmp_path), Turns(tmp_path)
    events: list[str] = []

    def serial_on_b():
        with worker_b.alone():
            events.append("serial starts")
            time.sleep(WAIT_S)
            events.append("serial ends")

    with worker_a.shared():
        thread = in_thread(serial_on_b)
        time.sleep(WAIT_S)
        assert events == []  # a's test is still running
    thread.join(5)
    assert events == ["serial starts", "serial ends"]


def test_a_waiting_serial_test_is_not_starved_by_shared_tests_that_come_after_it(tmp_path):
    worker_a, worker_b, worker_c = Turns(tmp_path), Turns(tmp_path), Turns(tmp_path)
    events: list[str] = []

    def serial_on_b():
        with worker_b.alone():
            events.append("serial")
            time.sleep(WAIT_S)

    def shared_on_a():
        with worker_a.shared():
            events.append("shared")

    with worker_c.shared():
        serial = in_thread(serial_on_b)
        time.sleep(WAIT_S)  # the serial test waits for c's
        shared = in_thread(shared_on_a)
        time.sleep(WAIT_S)
        assert events == []  # a shared test could run beside c's, but the serial one asked first
    serial.join(5)
    shared.join(5)
    assert events == ["serial", "shared"]


def test_shared_tests_run_side_by_side(tmp_path):
    worker_a, worker_b = Turns(tmp_path), Turns(tmp_path)
    entered: list[str] = []

    def shared_on_b():
        with worker_b.shared():
            entered.append("b")

    with worker_a.shared():
        in_thread(shared_on_b).join(5)
        assert entered == ["b"]  # while a's test runs


class Item:
    """A collected test as serial_last sees it: a name, and whether it is marked `serial`."""

    def __init__(self, name: str, serial: bool) -> None:
        self.name, self.serial = name, serial

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "serial" and self.serial else None


def test_serial_tests_go_last_each_part_in_its_order():
    items = [Item("a", True), Item("b", False), Item("c", True), Item("d", False), Item("e", False)]
    serial_last(items)
    assert [item.name for item in items] == ["b", "d", "e", "a", "c"]
