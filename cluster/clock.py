"""The clock the runtime's waits read and sleep on. A clock is called for the time in seconds (monotonic)
and has sleep(secs); SYSTEM is the machine's, and a test hands a wait one it drives instead (a sleep that
moves its time on), so that a timeout is tested without being waited for."""

import time


class SystemClock:
    def __call__(self) -> float:
        return time.monotonic()

    @staticmethod
    def sleep(secs: float) -> None:
        time.sleep(secs)


SYSTEM = SystemClock()
