// AWS's policy evaluation for batches of requests, by @cloud-copilot/iam-simulate (tools/iam/README.md).
//
// stdin: one batch a line, {"policies": {"<id>": <policy document>}, "requests": [{"principal",
//          "action", "resource", "account", "context", "identityPolicies": [["<name>", "<id>"]],
//          "resourcePolicy": "<id>"|null}]}
// stdout: a line for each batch: one answer per request, in order, {"result": "Allowed"|
//          "ExplicitlyDenied"|"ImplicitlyDenied"|"Error", "error", "grants", "denials"}
// It answers until stdin closes (the Python side keeps one process for a test session). The simulation
// runs in Strict mode: a condition key the request does not carry is absent, as in AWS.
import { createInterface } from 'node:readline'

import { getDenialReasons, getGrantReasons, runSimulation } from '@cloud-copilot/iam-simulate'

function statementOf(reason) {
  return {
    policyType: reason.policyType,
    policy: reason.policyIdentifier ?? null,
    sid: reason.statementId ?? null,
    index: reason.statementIndex ?? null
  }
}

function answer(response) {
  if (response.resultType === 'error') {
    return { result: 'Error', error: response.errors, grants: [], denials: [] }
  }
  // A wildcard resource on an action with resource types runs one simulation per matching pattern.
  const results = response.resultType === 'single' ? [response.result] : response.results
  return {
    result: response.overallResult,
    error: null,
    grants: results.flatMap((r) => getGrantReasons(r.analysis).map(statementOf)),
    denials: results.flatMap((r) => getDenialReasons(r.analysis).map(statementOf))
  }
}

async function decide(batch) {
  const answers = []
  for (const request of batch.requests) {
    const simulation = {
      request: {
        principal: request.principal,
        action: request.action,
        resource: { resource: request.resource, accountId: request.account },
        contextVariables: request.context ?? {}
      },
      identityPolicies: request.identityPolicies.map(([name, id]) => ({ name, policy: batch.policies[id] })),
      serviceControlPolicies: [],
      resourceControlPolicies: [],
      resourcePolicy: request.resourcePolicy ? batch.policies[request.resourcePolicy] : undefined
    }
    answers.push(answer(await runSimulation(simulation, { simulationMode: 'Strict' })))
  }
  return answers
}

async function main() {
  const lines = createInterface({ input: process.stdin, crlfDelay: Infinity })
  for await (const line of lines) {
    if (line.trim()) process.stdout.write(JSON.stringify(await decide(JSON.parse(line))) + '\n')
  }
}

main().catch((error) => {
  process.stderr.write(`${error.stack ?? error}\n`)
  process.exit(1)
})
