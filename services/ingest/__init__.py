"""The ingest gateway (`rollstream ingest`, DESIGN.md section 8): production agent traces
and feedback on them, over HTTP, into the training stream.

- POST /v1/trajectories: a trace in OpenAI chat format (tools and tool calls included),
  token ids and logprobs optional (else tokenised with the policy's tokenizer). It becomes
  a Trajectory with origin=production, a group of its own.
- POST /v1/feedback: a score, label or thumbs for an earlier trace.
- GET /healthz; OpenAPI at /openapi.json, docs at /docs.

Where a trace goes (the join of feedback to its trace happens here, in the gateway):

- with a `verifier`: published on `trajectories` at once; the reward dispatcher scores it
  like any rollout.
- otherwise it waits for its feedback, held in Redis for `ingest.feedback_window_s`
  (or it carries its feedback inline). When the feedback arrives the gateway is the
  trace's verifier: it publishes the Feedback on `feedback` (the record of what was said)
  and the trace with its reward, a ScoredTrajectory, on `rewards`, where the learner trains
  it through the reward-weighted likelihood term and writes its ledger entry. Such traces
  never pass the dispatcher: there is nothing for a sandbox to run, and a group of one has
  no group-relative advantage (services/ingest/feedback.py says how reward and advantage
  are set).

Modules: models (HTTP bodies), convert (request -> Trajectory, pure), feedback (judgement
-> reward, pure), tokenizer, state (Redis: idempotency, held traces), publish (Kafka),
gate (auth and size limit), routes (the two write calls), app (FastAPI), server (uvicorn).
"""
