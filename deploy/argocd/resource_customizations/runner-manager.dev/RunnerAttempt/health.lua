-- Argo CD health of a runner-manager.dev RunnerAttempt (Lua 5.1; `obj` is the object).
-- Degraded when its workspace is quarantined (or its package or spec refused) and while a
-- failed launch is not yet cleaned; Progressing on the way up and while cleaning; Healthy when
-- idle, busy, finished well, or cleaned.
local hs = {}
local status = obj.status or {}
local function condition(t)
  if status.conditions ~= nil then
    for _, c in ipairs(status.conditions) do
      if c.type == t and c.status == "True" then
        return c
      end
    end
  end
  return nil
end
local function outcome()
  if status.outcome == nil then
    return ""
  end
  local text = status.outcome.kind or ""
  if status.outcome.reason ~= nil then
    text = text .. "(" .. status.outcome.reason .. ")"
  end
  return text
end
for _, t in ipairs({"Quarantined", "PackageRefused", "SpecMismatch"}) do
  local c = condition(t)
  if c ~= nil then
    hs.status = "Degraded"
    hs.message = t .. ": " .. (c.reason or "") .. (c.message and (": " .. c.message) or "")
    return hs
  end
end
local state = status.state or "Pending"
local up = {Pending = true, Allocated = true, Preparing = true, Prepared = true,
  JitReceived = true, Starting = true}
if up[state] then
  hs.status = "Progressing"
  hs.message = state
  if obj.metadata.deletionTimestamp ~= nil then
    hs.message = state .. ", terminating"
  end
  return hs
end
if state == "Idle" or state == "Busy" then
  hs.status = "Healthy"
  hs.message = state
  if state == "Busy" and status.job ~= nil and status.job.id ~= nil then
    hs.message = string.format("Busy with job %d", status.job.id)
  end
  return hs
end
if state == "Failed" or state == "Orphaned" then
  hs.status = "Degraded"
  hs.message = state .. ", not yet cleaned: " .. outcome()
  return hs
end
if state == "Finished" or state == "Destroying" or state == "CleanupDeferred" then
  hs.status = "Progressing"
  hs.message = state .. " (cleaning up): " .. outcome()
  local deferred = condition("CleanupDeferred")
  if deferred ~= nil then
    hs.message = hs.message .. "; cleanup deferred: " .. (deferred.reason or "")
  end
  return hs
end
if state == "Cleaned" then
  hs.status = "Healthy"
  hs.message = "Cleaned: " .. outcome()
  return hs
end
hs.status = "Unknown"
hs.message = "Unknown state " .. tostring(state)
return hs
