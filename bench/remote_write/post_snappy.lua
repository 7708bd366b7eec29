-- wrk script: POST prepared remote-write bodies (snappy protobuf) in rotation.
-- args: <bodies file> <path> <content-type>
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
  placeholder = args[4]
  run = args[5] or "0000"
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
end

function request()
  i = i + 1
  local k = (i % n) + 1
  if placeholder then
    local key = string.format("%s%02d%010d", run, tid, i)
    return wrk.format("POST", path, headers, pre[k] .. key .. post[k])
  end
  return whole[k]
end

function response(status, hdrs, body)
  st[status] = (st[status] or 0) + 1
end

function done(summary, latency, requests)
  local codes = {}
  for _, t in ipairs(threads) do
    local s = t:get("st")
    if s then
      for code, c in pairs(s) do codes[code] = (codes[code] or 0) + c end
    end
  end
  local parts = {}
  for code, c in pairs(codes) do table.insert(parts, string.format('"%d": %d', code, c)) end
  io.write(string.format(
    'WRKJSON {"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "errors_connect": %d, ' ..
    '"errors_read": %d, "errors_write": %d, "errors_timeout": %d, "status": {%s}}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    summary.errors.connect, summary.errors.read, summary.errors.write, summary.errors.timeout,
    table.concat(parts, ", ")))
end
