// Who is signed in, and the team names this key may see. Cleared whole on login and logout, so
// nothing one key was shown outlives it.

import {api} from "./api.js";

let me = null;
let teamNames = new Map();
let namesLoadedAt = 0;
const NAMES_RETRY_MS = 30000;

export function currentUser() {
  return me;
}

export async function loadMe() {
  me = await api("/v1/me");
  teamNames.set(me.team_id, me.team);
  return me;
}

export function resetSession() {
  me = null;
  teamNames = new Map();
  namesLoadedAt = 0;
}

export function rememberTeams(teams) {
  for (const team of teams) teamNames.set(team.team_id, team.team);
}

// An admin sees several teams' jobs: an id not known yet is looked up in /v1/cluster (at most
// every half minute); until then, or if it is not there, the id is shown.
export async function loadTeamNames(teamIds) {
  const known = teamIds.every((id) => teamNames.has(id));
  if (!me || !me.is_admin || known || Date.now() - namesLoadedAt < NAMES_RETRY_MS) return;
  namesLoadedAt = Date.now();
  try {
    rememberTeams((await api("/v1/cluster")).teams);
  } catch {
    // Only labels: a failure leaves the ids showing.
  }
}

export function teamName(teamId) {
  return teamNames.get(teamId) || `team ${teamId}`;
}
