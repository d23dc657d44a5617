#!/usr/bin/env bash
# Prints how to register an installed sandbox-mcp with MCP clients:
#   scripts/print-registration.sh /abs/path/to/sandbox-mcp
# The wording comes from `sandbox-mcp config`, so the two never disagree.
set -euo pipefail

bin=$1
echo
echo "sandbox-mcp installed at $bin"
echo
echo "Claude Code:"
"$bin" config claude 2>/dev/null | sed 's/^/  /'
echo
echo "Cursor (~/.cursor/mcp.json) and Claude Desktop (claude_desktop_config.json):"
"$bin" config cursor 2>/dev/null | sed 's/^/  /'
echo
echo "HTTP mode: sandbox-mcp serve --http, then sandbox-mcp config claude --http http://127.0.0.1:8765/mcp"
