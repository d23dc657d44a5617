"""Terminal control sequences from a sandbox reach the client as visible
escapes (issue 9, finding 5): `ESC ]0;…BEL` must not retitle, nor `CSI 2J`
clear, the terminal of whoever reads a tool's text. Newline, carriage
return and tab stay; structuredContent keeps the exact bytes."""

RAW = "\x1b]0;pwned\x07\x1b[2J"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[2J"
CONTROLS = [chr(c) for c in range(0x20) if chr(c) not in "\n\r\t"] + ["\x7f"] + [chr(c) for c in range(0x80, 0xA0)]


def no_controls(text: str) -> bool:
    return not any(c in text for c in CONTROLS)


def test_exec_output_shows_escapes_and_structured_content_stays_exact(srv):
    r = srv.call_raw("exec", command=r"printf '\033]0;pwned\007\033[2J'; printf 'a\tb\r\nc\n'; printf '\033[31m' >&2")
    text = r.content[0].text
    assert text.startswith(SHOWN + "a\tb\r\nc\n[stderr] \\x1b[31m"), text
    assert no_controls(text), repr(text)
    assert r.structured_content["stdout"] == RAW + "a\tb\r\nc\n", r.structured_content
    assert r.structured_content["stderr"] == "\x1b[31m", r.structured_content


def test_every_tool_carrying_sandbox_bytes_escapes_them(srv):
    # DEL, a C1 CSI and BEL, through read_file, python, logs, history, env and errors.
    assert not srv.tool("exec", command=r"printf 'x\177y\302\233z\007' > /tmp/f")[1]
    text, err = srv.tool("read_file", path="/tmp/f")
    assert not err and "x\\x7fy\\u009bz\\x07" in text and no_controls(text), repr(text)
    text, err = srv.tool("python", code=r"print('\x1b]0;pwned\x07')")
    assert not err and "\\x1b]0;pwned\\x07" in text and no_controls(text), repr(text)
    assert not srv.tool("bg", command=r"printf '\033[2J'; sleep 60", name="noisy")[1]
    from waiting import wait_for
    assert wait_for(lambda: "\\x1b[2J" in srv.tool("logs", name="noisy")[0], timeout=20), srv.tool("logs", name="noisy")
    assert no_controls(srv.tool("logs", name="noisy")[0])
    assert not srv.tool("exec", command="echo '\x1b]0;in-history\x07'")[1]
    text, _ = srv.tool("history")
    assert "\\x1b]0;in-history\\x07" in text and no_controls(text), repr(text)
    text, err = srv.tool("read_file", path="/nonexistent/\x1b[2J")
    assert err and no_controls(text), repr(text)
    assert not srv.tool("env", action="set", key="TITLE", value="\x1b]0;t\x07")[1]
    text, _ = srv.tool("env", action="list")
    assert "\\x1b]0;t\\x07" in text and no_controls(text), repr(text)
