--[[
The class's GPU limit under SLURM: each learner holds at most GPUS_PER_LEARNER GPUs across
all of their jobs that are pending, running or suspended, however they ask (their server's
job, sbatch, salloc or srun outside a job). A learner's job that would pass it is refused at
submission with the reason, and a learner cannot raise a job's GPUs afterwards.

classroom.py writes this file, with the class's learners, to DIR/config/job_submit.lua
(`init` and `accounts add`); install it as job_submit.lua beside slurm.conf on the
controller, with JobSubmitPlugins=lua in slurm.conf. slurmctld reads it again when it
changes, so a copy after `accounts add` needs no restart. Other users' jobs are untouched.
--]]

-- Filled in by classroom.py: {[uid] = "name", ...} and the number of GPUs.
local LEARNERS = {--LEARNERS--}
local GPUS_PER_LEARNER = --GPUS--

local NO_VAL = 4294967294  -- SLURM's "not set" for 32-bit fields
local ENDED = 3            -- job_state below this: pending (0), running (1), suspended (2)
local HOW = "ask for GPUs with --gres=gpu:N, --gpus-per-node=N or --gpus=N, in one job " ..
            "(no arrays or heterogeneous jobs, no GPUs per task or socket)"

-- GPUs in a TRES request such as "gres:gpu:2", "gres/gpu:a100:2" or "gres:gpu"; nil where
-- the count is not a plain number (a suffix such as 2k): not counted, so refused.
local function gpus(tres)
    if tres == nil or tres == "" then
        return 0
    end
    local total = 0
    for item in string.gmatch(tres, "[^,]+") do
        if string.find(item, "gpu", 1, true) then
            local count = string.match(item, ":(%d+)$")
            if count == nil and string.match(item, "gpu$") == nil then
                local name = string.match(item, "gpu:(%a[%w_-]*)$")  -- a type, no count
                if name == nil then
                    return nil
                end
            end
            total = total + tonumber(count or 1)
        end
    end
    return total
end

local function bounded(value)
    return value ~= nil and value > 0 and value < NO_VAL
end

-- The most nodes a job can get: its maximum where set, else its minimum (at least one).
local function nodes(job)
    local most = 1
    if bounded(job.min_nodes) then most = job.min_nodes end
    if bounded(job.max_nodes) and job.max_nodes > most then most = job.max_nodes end
    if bounded(job.total_nodes) and job.total_nodes > most then most = job.total_nodes end
    return most
end

-- GPUs a job asks for at most; nil where this file cannot bound them.
local function asked(job)
    local per_task, per_socket = gpus(job.tres_per_task), gpus(job.tres_per_socket)
    local per_node, per_job = gpus(job.tres_per_node), gpus(job.tres_per_job)
    if per_task ~= 0 or per_socket ~= 0 or per_node == nil or per_job == nil then
        return nil
    end
    local most = per_node * nodes(job)
    if per_job > most then most = per_job end
    if most > 0 and job.array_inx ~= nil and job.array_inx ~= "" then
        return nil  -- every task of an array would hold them
    end
    return most
end

local function held(uid)
    local total = 0
    for _, job in pairs(slurm.jobs or {}) do
        if job.user_id == uid and job.job_state % 256 < ENDED then
            total = total + (asked(job) or GPUS_PER_LEARNER + 1)
        end
    end
    return total
end

function slurm_job_submit(job_desc, part_list, submit_uid)
    local name = LEARNERS[job_desc.user_id]
    if name == nil then
        return slurm.SUCCESS
    end
    local want = asked(job_desc)
    local offset = job_desc.het_job_offset
    if want ~= 0 and offset ~= nil and offset < NO_VAL then
        want = nil  -- each component of a heterogeneous job is checked before any exists
    end
    if want == nil then
        slurm.log_user("ddp-workshop: %s: %s", name, HOW)
        return slurm.ERROR
    end
    if want == 0 then
        return slurm.SUCCESS
    end
    local have = held(job_desc.user_id)
    if have + want > GPUS_PER_LEARNER then
        slurm.log_user("ddp-workshop: %s: a learner holds at most %d GPU(s) at a time; your " ..
                       "jobs hold or wait for %d and this one asks for %d. Train inside " ..
                       "your server's job (torchrun there uses your GPU).",
                       name, GPUS_PER_LEARNER, have, want)
        slurm.log_info("ddp-workshop: refused %s's job asking for %d GPU(s) (holds %d)",
                       name, want, have)
        return slurm.ERROR
    end
    return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
    local name = LEARNERS[job_rec.user_id]
    if name == nil or modify_uid == 0 then
        return slurm.SUCCESS
    end
    for _, field in ipairs({"tres_per_node", "tres_per_job", "tres_per_task",
                            "tres_per_socket"}) do
        if job_desc[field] ~= nil then
            slurm.log_user("ddp-workshop: %s: a job's GPUs are set when it is submitted", name)
            return slurm.ERROR
        end
    end
    if bounded(job_desc.min_nodes) or bounded(job_desc.max_nodes) then
        slurm.log_user("ddp-workshop: %s: a job's nodes are set when it is submitted", name)
        return slurm.ERROR
    end
    return slurm.SUCCESS
end

slurm.log_info("ddp-workshop: job_submit.lua loaded: %d GPU(s) per learner", GPUS_PER_LEARNER)
return slurm.SUCCESS
