// The TypeScript SDK's MCP client (@modelcontextprotocol/sdk) through the gateway: list every
// page of tools, call one, print a JSON transcript. Usage: node ts_client.mjs <url> <token> <tool> <text>
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, token, tool, text] = process.argv.slice(2);
const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
});
const client = new Client({ name: "toolbus-gateway-test", version: "1.0.0" });
await client.connect(transport);
const names = [];
let pages = 0;
let cursor;
do {
  const page = await client.listTools(cursor ? { cursor } : {});
  pages += 1;
  for (const t of page.tools) names.push(t.name);
  cursor = page.nextCursor;
} while (cursor);
const result = await client.callTool({ name: tool, arguments: { text } });
console.log(JSON.stringify({ protocol: transport.protocolVersion ?? null, sessionId: transport.sessionId ?? null, pages, names, result }));
await client.close();
