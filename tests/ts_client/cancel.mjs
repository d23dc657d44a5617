// Connects the official TypeScript MCP client over Streamable HTTP (argv[2]: URL, argv[3]: bearer token or ""),
// starts a long exec, cancels it through an AbortSignal once it runs, then counts the GETs the client sends
// over the next argv[4] seconds (its fetch is wrapped), and checks the session still works; prints a JSON summary.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, watch] = [process.argv[2], process.argv[3], Number(process.argv[4])];
const gets = [];
const counting = (input, init) => {
  if ((init?.method ?? "GET") === "GET") gets.push({ at: Date.now(), lastEventId: new Headers(init?.headers).get("last-event-id") });
  return fetch(input, init);
};
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const transport = new StreamableHTTPClientTransport(new URL(url), { fetch: counting, requestInit: { headers } });
const errors = [];
transport.onerror = (e) => errors.push(String(e));
const client = new Client({ name: "ts-sdk-cancel-test", version: "0" });
await client.connect(transport);
const abort = new AbortController();
const call = client.callTool({ name: "exec", arguments: { command: "sleep 40", timeout: 120 } }, undefined, { signal: abort.signal });
await new Promise((r) => setTimeout(r, 3000));
const cancelledAt = Date.now();
abort.abort("test cancels the call");
let outcome;
try { await call; outcome = "answered"; } catch (e) { outcome = `rejected: ${e}`; }
await new Promise((r) => setTimeout(r, watch * 1000));
const after = gets.filter((g) => g.at >= cancelledAt);
const result = await client.callTool({ name: "exec", arguments: { command: "echo still-works" } });
console.log(JSON.stringify({ outcome, getsAfterCancel: after.length, gets: after.map((g) => [g.at - cancelledAt, g.lastEventId]), errors: errors.slice(0, 5), text: result.content[0].text }));
await client.close();
