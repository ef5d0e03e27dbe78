// The page served by `gptlite serve`: it writes through the server's API (OpenAI's completions and chat
// completions, streamed) and explains with the traces the server computes (/v1/trace), where the static page runs
// the model itself. Nothing here runs a model.
import { unpacked } from "./inside_data.js";

// The API key lasts as long as the browser tab: kept in its session storage, sent to this server only.
export function keyBox(input, label) {
  input.value = sessionStorage.getItem("gptlite_api_key") || "";
  if (input.value) label.hidden = false;
  input.addEventListener("input", () => sessionStorage.setItem("gptlite_api_key", input.value));
  return () => {
    const headers = { "Content-Type": "application/json" };
    if (input.value) headers.Authorization = `Bearer ${input.value}`;
    return headers;
  };
}

// A refusal's message, as the server words it; a 401 shows the key box.
async function refusal(response, label) {
  if (response.status === 401) label.hidden = false;
  try { return (await response.json()).error.message; } catch { return `${response.status} ${response.statusText}`; }
}

// The text a request writes, piece by piece as the server streams it. `body`: a prompt (or a Seq2Seq's source) or
// messages, and the settings by their request names (config.json's `sampling`).
export async function* writtenOnServer(body, headers, label, signal) {
  const chat = "messages" in body;
  const response = await fetch(chat ? "/v1/chat/completions" : "/v1/completions", {
    method: "POST", headers: headers(), body: JSON.stringify({ ...body, stream: true }), signal });
  if (!response.ok) throw new Error(await refusal(response, label));
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith("data: ") || event === "data: [DONE]") continue;
      const message = JSON.parse(event.slice(6));
      if (message.error) throw new Error(message.error.message);
      for (const choice of message.choices) yield chat ? choice.delta?.content ?? "" : choice.text;
    }
  }
}

// The trace of a text or a conversation, as the server computes it (gptlite.trace): {trace, sampling}.
export async function tracedOnServer(body, headers, label) {
  const response = await fetch("/v1/trace", { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!response.ok) throw new Error(await refusal(response, label));
  const { trace, text_ids: textIds, sampling } = await response.json();
  return { trace: unpacked(trace), textIds, sampling };
}

// Every head scored on the token `ids` by the server (gptlite.heads; a film's `frame`'s model where one is given):
// {previous_token, first_token, current_token, induction, ablation, loss, ...}, as the view's grid reads them.
export async function headsOnServer(ids, headers, label, frame = null) {
  const body = frame === null ? { ids } : { ids, frame };
  const response = await fetch("/v1/heads", { method: "POST", headers: headers(), body: JSON.stringify(body) });
  if (!response.ok) throw new Error(await refusal(response, label));
  return response.json();
}

// The settings as a request names them (max_tokens for max_new_tokens), those left empty left out.
export function requestSettings(config, settings) {
  return Object.fromEntries(config.sampling.filter((s) => settings[s.name] !== null)
    .map((s) => [s.request, settings[s.name]]));
}
