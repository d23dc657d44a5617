"""The disk quota against the writers an attack run used (issue 22): a flood of empty files and a
writer at full speed, each through a real MCP client on a sandbox with `disk = "1G"` (stdio only: the
quota is the helper's, the same whatever transport asked for the sandbox)."""
import re

from conftest import write_config
from waiting import poll

GIB = 1 << 30


def quota_server(front_end, env):
    write_config(env, '[defaults]\ndisk = "1G"\n')
    return front_end()


def test_dd_at_full_speed_keeps_at_most_a_tenth_past_the_quota(front_end, env):
    srv = quota_server(front_end, env)
    text, _ = srv.tool("exec", _timeout=360, command="dd if=/dev/zero of=/workspace/big bs=16M count=100", timeout=300)
    # The watcher killed it, or the kernel's cap on one file (the quota) refused its next write.
    assert "disk quota exceeded" in text or "File too large" in text, text
    # That cap may stop dd before the watcher's next walk, which records why (and kills what runs then).
    data = poll(lambda: srv.call_raw("stats").structured_content,
                lambda d: (d["quota_exceeded"] or "").startswith("disk quota exceeded"))
    assert data, "stats never recorded the quota as exceeded"
    kept, err = srv.tool("exec", command="stat -c '%b %B' /workspace/big")
    blocks, size = map(int, kept.splitlines()[0].split())
    assert not err and blocks * size <= GIB + GIB // 10, f"{blocks * size} bytes kept under a 1 GiB quota"
    srv.tool("exec", command="rm -f /workspace/big")


def test_three_hundred_thousand_empty_files_cannot_be_made_under_one_gib(front_end, env):
    srv = quota_server(front_end, env)
    flood = ("python3 -c 'import os\nos.mkdir(\"/tmp/f\")\nfor i in range(300000):\n"
             "    os.close(os.open(f\"/tmp/f/{i}\", os.O_CREAT | os.O_WRONLY))\nprint(\"made them all\")'")
    text, _ = srv.tool("exec", _timeout=660, command=flood, timeout=600)
    assert "disk quota exceeded" in text and "made them all" not in text, text
    count, err = srv.tool("exec", _timeout=180, command="find /tmp/f -mindepth 1 | wc -l", timeout=120)
    assert not err and int(count.splitlines()[0]) < 300000, count
    text, _ = srv.tool("stats")
    assert re.search(r"^Quota:   disk quota exceeded: .+ used of 1 GiB", text, re.M), text
    srv.tool("exec", _timeout=360, command="rm -rf /tmp/f", timeout=300)


def test_an_upload_larger_than_the_quota_fails_naming_it_and_leaves_nothing(front_end, env, roots):
    write_config(env, '[defaults]\ndisk = "64M"\n')
    srv = front_end(SANDBOX_MCP_HOST_ROOTS=str(roots))
    with open(roots / "huge.bin", "wb") as f:
        f.truncate(65 << 20)
    text, err = srv.tool("upload", local_path=str(roots / "huge.bin"), sandbox_path="/tmp/huge.bin")
    assert err and "/tmp/huge.bin" in text and ("File too large" in text or "No space left" in text), text
    # The agent that wrote it still serves, and no part of the file stayed.
    out, err = srv.tool("exec", command="ls -A /tmp; echo alive")
    assert not err and out.startswith("alive"), out
