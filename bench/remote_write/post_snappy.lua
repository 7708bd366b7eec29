-- wrk script: POST prepared remote-write bodies (snappy protobuf) in rotation.
-- args: <bodies file> <path> <content-type> [offset nthreads]
-- The bodies file holds records "<10-digit length><body>". Derived from bench/ingest/post_bodies.lua
-- (same framing and WRKJSON summary) with the remote-write headers; no placeholder: a
-- remote-write body is compressed, and its content (series and timestamps) makes it distinct.
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
  headers = {["Content-Type"] = args[3], ["Content-Encoding"] = "snappy",
             ["X-Prometheus-Remote-Write-Version"] = "0.1.0"}
  -- Bodies are dealt out, not replayed: thread t of nthreads posts bodies offset + t,
  -- offset + t + nthreads, ... (1-based), so no two requests of a run carry the same body and
  -- a later run given offset = the previous run's "last" continues where it stopped (a repeat
  -- is a cheap duplicate for gpufleet, not a measurement). Each thread keeps only its own.
  offset = tonumber(args[4] or "0")
  nthreads = tonumber(args[5] or "1")
  local all = {}
  local pos = 1
  while pos <= #data do
    local len = tonumber(data:sub(pos, pos + 9))
    table.insert(all, {pos + 10, len})
    pos = pos + 10 + len
  end
  n = #all
  mine = {}
  local k = offset + tid
  for _ = 1, math.ceil(n / nthreads) do
    local b = all[((k - 1) % n) + 1]
    table.insert(mine, wrk.format("POST", path, headers, data:sub(b[1], b[1] + b[2] - 1)))
    k = k + nthreads
  end
  i = 0
  st = {}
end

function request()
  i = i + 1
  return mine[((i - 1) % #mine) + 1]
end

function response(status, hdrs, body)
  st[status] = (st[status] or 0) + 1
end

function done(summary, latency, requests)
  local codes = {}
  local last = 0  -- the highest body number any thread posted (before wrapping around)
  for _, t in ipairs(threads) do
    local ti, tt = t:get("i"), t:get("tid")
    if ti and ti > 0 then last = math.max(last, t:get("offset") + (ti - 1) * t:get("nthreads") + tt) end
    local s = t:get("st")
    if s then
      for code, c in pairs(s) do codes[code] = (codes[code] or 0) + c end
    end
  end
  local parts = {}
  for code, c in pairs(codes) do table.insert(parts, string.format('"%d": %d', code, c)) end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "errors_connect": %d, ' ..
    '"errors_read": %d, "errors_write": %d, "errors_timeout": %d, "last": %d, "bodies": %d, "status": {%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    last, threads[1]:get("n") or 0, table.concat(parts, ", ")))
end
