// Access to the node's HTTP API: the admin key, JSON requests and errors.
// The key lives in sessionStorage only and travels in request headers.

const KEY_NAME = "herald.console.key";

export const getKey = () => sessionStorage.getItem(KEY_NAME);
export const setKey = (key) => sessionStorage.setItem(KEY_NAME, key);
export const clearKey = () => sessionStorage.removeItem(KEY_NAME);

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Reads the error out of a failed answer; both `{"error":{code,message}}`
// and `{code,message}` shapes are accepted.
export async function errorFrom(response) {
  const text = await response.text().catch(() => "");
  let body = null;
  try { body = JSON.parse(text); } catch { /* not JSON */ }
  const err = body && typeof body === "object" ? (body.error && typeof body.error === "object" ? body.error : body) : {};
  const code = err.code ?? null;
  const message = typeof err.message === "string" && err.message
    ? err.message
    : (text.trim().slice(0, 300) || `${response.status} ${response.statusText}`);
  return new ApiError(response.status, code, message);
}

// Headers for the admin API (Bearer) or the server API (X-API-Key).
export function authHeaders(kind = "bearer", key = getKey()) {
  if (!key) return {};
  return kind === "apikey" ? { "X-API-Key": key } : { Authorization: `Bearer ${key}` };
}

// Sends a request; resolves to {status, body} for 2xx answers and throws an
// ApiError otherwise (a network failure becomes status 0).
export async function request(path, { method = "GET", body, headers = {}, auth = "bearer", key, signal } = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      body,
      signal,
      cache: "no-store",
      headers: { Accept: "application/json", ...authHeaders(auth, key ?? getKey()), ...headers },
    });
  } catch (e) {
    if (e.name === "AbortError") throw e;
    throw new ApiError(0, "network", `network error: ${e.message}`);
  }
  if (!response.ok) throw await errorFrom(response);
  const text = await response.text();
  return { status: response.status, body: text ? JSON.parse(text) : null };
}

export async function getJson(path, options) {
  return (await request(path, options)).body;
}

// Calls a Centrifugo-style server API method (POST /api/<method>).
// Errors may come inside a 200 answer as {"error":{code,message}}.
export async function serverApi(method, params) {
  const { status, body } = await request(`/api/${method}`, {
    method: "POST",
    auth: "apikey",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(params),
  });
  if (body && body.error) throw new ApiError(status, body.error.code ?? null, body.error.message || "error");
  return body ? body.result : null;
}

// Path segment of a channel name.
export const channelPath = (name) => `/v1/channels/${encodeURIComponent(name)}`;
