"""MCP polish through a real client: server identity and instructions, tool
annotations, structured output that validates against the declared schema,
progress notifications during a long call, and cancellation that stops the
work in the sandbox."""
import jsonschema

from waiting import poll

SLEEPERS = "cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$' || true"


def test_identity_and_instructions(server):
    init = server.server_info
    assert init.server_info.name == "sandbox-mcp"
    assert "sandbox" in (init.instructions or "").lower()


def test_every_tool_declares_annotations(server):
    for tool in server.list_tools():
        a = tool.annotations
        assert a is not None, f"{tool.name} has no annotations"
        if a.read_only_hint:
            assert not a.destructive_hint, tool.name
        else:
            assert a.destructive_hint is not None, f"{tool.name}: destructiveHint missing"
        assert a.open_world_hint is not None, f"{tool.name}: openWorldHint missing"
    by_name = {t.name: t.annotations for t in server.list_tools()}
    assert by_name["status"].read_only_hint and by_name["history"].read_only_hint
    assert by_name["destroy"].destructive_hint


def test_exec_structured_output_matches_schema(server):
    tools = {t.name: t for t in server.list_tools()}
    schema = tools["exec"].output_schema
    assert schema and {"stdout", "stderr", "exit_code", "duration_ms", "truncated"} <= set(schema["properties"])
    result = server.call_raw("exec", command="echo out; echo err >&2; exit 3")
    data = result.structured_content
    jsonschema.validate(data, schema)
    assert data["stdout"] == "out\n" and data["stderr"] == "err\n"
    assert data["exit_code"] == 3 and data["truncated"] is False and data["timed_out"] is False
    big = server.call_raw("python", code="print('x' * 100000)").structured_content
    jsonschema.validate(big, tools["python"].output_schema)
    assert big["truncated"] is True and len(big["stdout"]) == 50000


def test_progress_notifications_during_a_long_call(server):
    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, message))

    result = server._run(
        lambda s: s.call_tool("exec", {"command": "sleep 2.5; echo done"}, progress_callback=on_progress),
        30, "exec with progress")
    assert "done" in result.content[0].text
    assert len(seen) >= 2, seen
    assert [p for p, _ in seen] == sorted(p for p, _ in seen)
    assert seen[0][1].startswith("exec: ")


def test_cancellation_stops_the_work(server):
    server.tool("exec", command="true")
    try:
        server._run(lambda s: s.call_tool("exec", {"command": "sleep 300; echo never"}, read_timeout_seconds=1),
                    30, "cancelled exec")
    except AssertionError:
        pass  # the client gave up: it sends notifications/cancelled
    gone = poll(lambda: server.tool("exec", command=SLEEPERS)[0], lambda t: t.startswith("0\n"))
    assert gone, "the cancelled command kept running"


def test_stats_and_history_structured_output(server):
    tools = {t.name: t for t in server.list_tools()}
    server.tool("exec", command="echo one")
    server.tool("exec", command="exit 2")
    history = server.call_raw("history").structured_content
    jsonschema.validate(history, tools["history"].output_schema)
    assert [e["command"] for e in history["entries"]] == ["exit 2", "echo one"]
    assert history["entries"][0]["exit_code"] == 2
    stats = server.call_raw("stats").structured_content
    jsonschema.validate(stats, tools["stats"].output_schema)
    assert stats["sandbox"] == "default" and stats["memory_limit_bytes"] == 512 << 20
    assert stats["history_commands"] == 2
    # Memory counters come from the sandbox's cgroup, which an ordinary user only has where cgroups are
    # delegated to it (without, its sandboxes run without limits, and say so).
    if not stats.get("limits_not_enforced"):
        assert stats["memory_used_bytes"] > 0
    empty = server.call_raw("history", sandbox="nobody").structured_content
    assert empty == {"sandbox": "nobody", "entries": []}
