#!/usr/bin/env bash
# Prints how to register an installed sandbox-mcp with MCP clients:
#   scripts/print-registration.sh /abs/path/to/sandbox-mcp
set -euo pipefail

bin=$1
cat <<MSG

sandbox-mcp installed at $bin

Claude Code:
  claude mcp add sandbox -- $bin

Other MCP clients (mcpServers JSON):
  {
    "mcpServers": {
      "sandbox": { "command": "$bin", "args": [] }
    }
  }
MSG
