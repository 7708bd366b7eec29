-- wrk script: POST prepared bodies in rotation, each with a distinct idempotency key.
-- args: <bodies file> <path> <content-type> [placeholder run-id]
-- The bodies file holds records "<10-digit length><body>". When a placeholder is given,
-- every body contains it exactly once (inside agent.boot_id, same length) and each request
-- replaces it with a key unique per run (4-character run id), thread and request, so no
-- request is a duplicate, not even of an earlier run (the warm-up) against the same database.
local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("tid", counter)
  table.insert(threads, thread)
end

function init(args)
  local f = assert(io.open(args[1], "rb"))
  local data = f:read("*a")
  f:close()
  path = args[2]
  headers = {["Content-Type"] = args[3]}
  placeholder = args[4]
  run = args[5] or "0000"
  -- Bodies are dealt out, not replayed: thread t of nthreads takes bodies offset + t,
  -- offset + t + nthreads, ... (from the end backwards when reverse is given: the warm-up,
  -- so it never meets the measured run, which starts at the front), so no two requests of
  -- one database carry the same rows (the collector stores one sample per (GPU, ts)).
  offset = tonumber(args[6] or "0")
  nthreads = tonumber(args[7] or "1")
  reverse = args[8] == "reverse"
  pre, post, whole = {}, {}, {}
  local pos = 1
  while pos <= #data do
    local len = tonumber(data:sub(pos, pos + 9))
    local body = data:sub(pos + 10, pos + 9 + len)
    pos = pos + 10 + len
    if placeholder then
      local s, e = string.find(body, placeholder, 1, true)
      table.insert(pre, body:sub(1, s - 1))
      table.insert(post, body:sub(e + 1))
    else
      table.insert(whole, wrk.format("POST", path, headers, body))
    end
  end
  n = placeholder and #pre or #whole
  i = 0
  st = {}
  stored = 0
end

function request()
  i = i + 1
  local k = ((offset + (i - 1) * nthreads + tid - 1) % n) + 1
  if reverse then k = n + 1 - k end
  if placeholder then
    local key = string.format("%s%02d%010d", run, tid, i)
    return wrk.format("POST", path, headers, pre[k] .. key .. post[k])
  end
  return whole[k]
end

function response(status, hdrs, body)
  st[status] = (st[status] or 0) + 1
  -- gpufleet answers {"stored": N, "duplicate": ...}: rows a 200 really stored (a body that a
  -- busier thread reached twice under two keys is answered 0, its rows already stored)
  if status == 200 and body then
    local s = string.match(body, '"stored":%s*(%d+)')
    if s then stored = stored + tonumber(s) end
  end
end

function done(summary, latency, requests)
  local codes = {}
  local stored_rows = 0
  for _, t in ipairs(threads) do
    stored_rows = stored_rows + (t:get("stored") or 0)
    local s = t:get("st")
    if s then
      for code, c in pairs(s) do codes[code] = (codes[code] or 0) + c end
    end
  end
  local parts = {}
  for code, c in pairs(codes) do table.insert(parts, string.format('"%d": %d', code, c)) end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "errors_connect": %d, ' ..
    '"errors_read": %d, "errors_write": %d, "errors_timeout": %d, "stored_rows": %d, "status": {%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    stored_rows, table.concat(parts, ", ")))
end
