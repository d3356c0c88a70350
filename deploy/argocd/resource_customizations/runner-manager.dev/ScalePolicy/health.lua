-- Argo CD health of a runner-manager.dev ScalePolicy (Lua 5.1; `obj` is the object).
-- Progressing until the operator has seen this generation; Degraded on Degraded=True
-- (launches keep failing, replacement paused) or Ready=False (a spec, Secret or GitHub
-- problem the reason names); Suspended while spec.suspend is true (nothing is launched);
-- Healthy otherwise.
local hs = {}
local function condition(t)
  if obj.status ~= nil and obj.status.conditions ~= nil then
    for _, c in ipairs(obj.status.conditions) do
      if c.type == t then
        return c
      end
    end
  end
  return nil
end
local function describe(c)
  local text = c.reason or c.type
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end
local generation = obj.metadata.generation
local observed = nil
if obj.status ~= nil then
  observed = obj.status.observedGeneration
end
if obj.status == nil or observed == nil or (generation ~= nil and observed < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile this generation"
  return hs
end
local degraded = condition("Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded)
  return hs
end
local ready = condition("Ready")
if ready == nil or ready.status == "Unknown" then
  hs.status = "Progressing"
  hs.message = "Waiting for the Ready condition"
  return hs
end
if ready.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(ready)
  return hs
end
if obj.spec ~= nil and obj.spec.suspend == true then
  hs.status = "Suspended"
  hs.message = string.format("spec.suspend is true: nothing is launched; busy %d, idle %d",
    obj.status.busy or 0, obj.status.idle or 0)
  return hs
end
hs.status = "Healthy"
hs.message = string.format("desired %d, idle %d, busy %d, starting %d",
  obj.status.desired or 0, obj.status.idle or 0, obj.status.busy or 0, obj.status.starting or 0)
if (obj.status.quarantined or 0) > 0 then
  hs.message = hs.message .. string.format(", %d quarantined", obj.status.quarantined)
end
return hs
