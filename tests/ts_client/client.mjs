// Connects the official TypeScript MCP client to `sandbox-mcp` over stdio (argv[2]), lists the tools
// and runs one exec; prints a JSON summary. Schema warnings (Ajv's "unknown format") go to stderr.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const transport = new StdioClientTransport({ command: process.argv[2], args: [], env: process.env, stderr: "ignore" });
const client = new Client({ name: "ts-sdk-test", version: "0" });
await client.connect(transport);
const { tools } = await client.listTools();
const result = await client.callTool({ name: "exec", arguments: { command: "echo from-ts" } });
console.log(JSON.stringify({ tools: tools.length, text: result.content[0].text, isError: result.isError ?? false }));
await client.close();
