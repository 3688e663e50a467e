-- Argo CD health for petstore.example.com/Pet. Install it under
-- resource.customizations.health.petstore.example.com_Pet in argocd-cm
-- (docs/gitops-health.md). It reads the Pet's conditions for its current
-- generation only, so an edit is Progressing until the operator has
-- finished it.
local hs = {}

local function condition(type)
  if obj.status ~= nil and obj.status.conditions ~= nil then
    for _, c in ipairs(obj.status.conditions) do
      if c.type == type then
        return c
      end
    end
  end
  return nil
end

local generation = obj.metadata.generation
local synced = condition("Synced")

-- Held on purpose: paused, or a change waiting for approval (or only
-- observed). Nothing happens until a person acts, and nothing failed.
if synced ~= nil and (synced.reason == "ReconcilePaused" or synced.reason == "PlanPending"
    or synced.reason == "RecordDiffers") then
  hs.status = "Suspended"
  hs.message = synced.message
  return hs
end

local stalled = condition("Stalled")
if stalled ~= nil and stalled.status == "True" and stalled.observedGeneration == generation then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. stalled.message
  return hs
end

local ready = condition("Ready")
local reconciling = condition("Reconciling")
if obj.status ~= nil and obj.status.observedGeneration == generation and reconciling == nil
    and ready ~= nil and ready.status == "True" and ready.observedGeneration == generation then
  hs.status = "Healthy"
  hs.message = ready.message
  return hs
end

hs.status = "Progressing"
if reconciling ~= nil and reconciling.status == "True" then
  hs.message = reconciling.reason .. ": " .. reconciling.message
else
  hs.message = "waiting for the operator to reconcile generation " .. tostring(generation)
end
return hs
