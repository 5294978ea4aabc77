"""The trainer's live display off a terminal (a log file, CI): what follows it starts on a line of its own."""

import io

from rich.console import Console

from policystore.trainer.display import LiveDisplay


def test_a_log_line_after_the_live_display_starts_on_its_own_line():
    out = io.StringIO()
    console = Console(file=out, width=200, soft_wrap=True)
    assert not console.is_terminal
    with LiveDisplay(console, 10.0) as display:
        display.update({"elapsed_s": 5.0, "steps": 100, "steps_per_s": 20.0, "summary": []}, None)
    console.print("the next line")
    lines = out.getvalue().splitlines()
    assert "the next line" in lines
    assert any(line.strip().startswith("env steps") for line in lines)
