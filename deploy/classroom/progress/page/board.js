// The instructor's board: draws board.json every few seconds. Every text on the page comes
// from textContent (reasons and comments are learners' words), never from HTML.
"use strict";

const REFRESH_MS = 3000;

function element(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (className) node.className = className;
  return node;
}

function replace(id, ...children) {
  const target = document.getElementById(id);
  target.replaceChildren(...children);
}

function drawGrid(board, stuck) {
  // The day's exercises as columns, under a row that names their notebooks.
  const notebooks = element("tr");
  notebooks.append(element("th", ""));
  for (const exercise of board.exercises) {
    const last = notebooks.lastChild;
    if (last.dataset.notebook === exercise.notebook) {
      last.colSpan += 1;
    } else {
      const th = element("th", exercise.notebook, "notebook");
      th.dataset.notebook = exercise.notebook;
      notebooks.append(th);
    }
  }
  const head = element("tr");
  head.append(element("th", "learner (since their last check)", "learner"));
  for (const exercise of board.exercises) head.append(element("th", exercise.key));
  const rows = [notebooks, head];
  for (const learner of board.learners) {
    const row = element("tr");
    row.dataset.learner = learner;
    const since = (board.since_last_check || {})[learner];
    row.append(element("td", since === undefined ? learner : `${learner} (${since} min)`,
                       stuck.has(learner) ? "learner stuck" : "learner"));
    for (const exercise of board.exercises) {
      const cell = (board.cells[learner] || {})[exercise.key];
      if (!cell) {
        row.append(element("td", "·"));
        continue;
      }
      const td = element("td", `${cell.ok ? "PASS" : "NOT YET"} (${cell.attempts})`,
                         cell.ok ? "pass" : "notyet");
      td.dataset.key = exercise.key;
      td.title = cell.reason;
      row.append(td);
    }
    rows.push(row);
  }
  replace("grid", ...rows);
}

function drawStuck(board) {
  const t = board.thresholds;
  document.getElementById("rule").textContent =
    `Stuck: NOT YET ${t.stuck_after} or more times in a row on one exercise, or no verdict ` +
    `for ${t.quiet_minutes} minutes since a NOT YET (the learner's latest verdict).`;
  const items = board.stuck.map((entry) =>
    element("li", `${entry.learner}: ${entry.why.join("; ")}`, "stuck"));
  replace("stuck", ...(items.length ? items : [element("li", "nobody")]));
}

function drawReasons(board) {
  const blocks = [];
  for (const exercise of board.exercises) {
    const common = board.reasons[exercise.key];
    if (!common || !common.length) continue;
    const block = element("div");
    block.dataset.key = exercise.key;
    block.append(element("h3", exercise.key));
    const list = element("ol");
    for (const item of common) {
      const learners = item.learners === 1 ? "1 learner" : `${item.learners} learners`;
      list.append(element("li", `${learners} (${item.times}×): ${item.reason}`, "reason"));
    }
    block.append(list);
    blocks.push(block);
  }
  replace("reasons", ...(blocks.length ? blocks : [element("p", "no NOT YET so far")]));
}

function drawSurvey(board) {
  const survey = board.survey;
  const parts = [element("p", `${survey.answered} answered` +
    (survey.anonymous ? " (anonymous: who answered what is not shown)" : "") +
    (survey.withheld ? "; the answers are shown from 3 answers on" : ""))];
  const table = element("table");
  table.id = "ratings";
  const head = element("tr");
  for (const title of ["rating", "count", "mean", "1", "2", "3", "4", "5"]) {
    head.append(element("th", title));
  }
  table.append(head);
  for (const [name, rating] of Object.entries(survey.ratings)) {
    const row = element("tr");
    row.dataset.rating = name;
    row.append(element("td", name, "learner"), element("td", rating.count),
               element("td", rating.mean.toFixed(2)));
    for (const score of ["1", "2", "3", "4", "5"]) {
      row.append(element("td", rating.distribution[score]));
    }
    table.append(row);
  }
  parts.push(table);
  for (const [name, texts] of Object.entries(survey.comments)) {
    parts.push(element("h3", name));
    const list = element("ul");
    for (const comment of texts) {
      list.append(element("li", typeof comment === "string" ? comment
                                                          : `${comment.learner}: ${comment.text}`,
                          "reason"));
    }
    parts.push(list);
  }
  replace("survey", ...parts);
}

async function refresh() {
  try {
    const xsrf = document.querySelector("meta[name=xsrf-token]").content;
    const response = await fetch("board.json", {credentials: "same-origin", cache: "no-store",
                                                headers: {"X-XSRFToken": xsrf}});
    if (!response.ok) throw new Error(`board.json: ${response.status}`);
    const board = await response.json();
    const stuck = new Set(board.stuck.map((entry) => entry.learner));
    drawStuck(board);
    drawGrid(board, stuck);
    drawReasons(board);
    drawSurvey(board);
    document.getElementById("updated").textContent = `updated ${board.generated}`;
    document.body.dataset.generated = board.generated;
  } catch (error) {
    document.getElementById("updated").textContent = `not updated: ${error.message}`;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
