// Rating page of the captioner human-rating kit. All kit data (captions, words, file names)
// is inserted with textContent or as attribute values, never parsed as HTML (node() of
// common.js).
"use strict";
(function () {
  const kit = JSON.parse(document.getElementById("kit-data").textContent);
  const storageKey = "captioner-rating-kit:" + kit.kit_id;
  const KINDS = [["caption", "Caption quality (1 = bad, 5 = excellent)"],
                 ["attention", "Attention relevance (1 = irrelevant, 5 = exactly the right regions)"]];

  function emptyState() {
    return { kit_id: kit.kit_id, rater_id: "", index: 0, ratings: {} };
  }

  function loadState() {
    try {
      const saved = JSON.parse(window.localStorage.getItem(storageKey));
      if (saved && saved.kit_id === kit.kit_id && typeof saved.ratings === "object") {
        return saved;
      }
    } catch (err) {
      setStatus("Saved progress could not be read; starting afresh.");
    }
    return emptyState();
  }

  let state = loadState();

  function saveState() {
    try {
      window.localStorage.setItem(storageKey, JSON.stringify(state));
    } catch (err) {
      setStatus("Could not save progress in this browser: " + err + ". Export often.");
    }
  }

  function setStatus(text, ok) {
    const status = document.getElementById("status");
    status.textContent = text;
    status.className = ok ? "ok" : "";
  }

  function rating(imageKey, label) {
    const byImage = state.ratings[imageKey] || {};
    return byImage[label] || {};
  }

  function setScore(imageKey, label, kind, score) {
    const byImage = (state.ratings[imageKey] = state.ratings[imageKey] || {});
    const entry = (byImage[label] = byImage[label] || {});
    entry[kind + "_score"] = score;
    entry[kind + "_time"] = new Date().toISOString();
    saveState();
    updateProgress();
  }

  function isComplete(image, caption) {
    const entry = rating(image.key, caption.label);
    return Number.isInteger(entry.caption_score) && Number.isInteger(entry.attention_score);
  }

  function imageComplete(image) {
    return image.captions.every((caption) => isComplete(image, caption));
  }

  function updateProgress() {
    const done = kit.images.filter(imageComplete).length;
    document.getElementById("progress").textContent =
      done + " of " + kit.images.length + " images rated";
    const jump = document.getElementById("jump");
    kit.images.forEach((image, i) => {
      jump.options[i].textContent = "Image " + (i + 1) + (imageComplete(image) ? " \u2713" : "");
    });
    const current = kit.images[state.index];
    for (const caption of current.captions) {
      const card = document.getElementById("card-" + caption.label);
      if (card) {
        card.classList.toggle("complete", isComplete(current, caption));
      }
    }
  }

  function scoreField(image, caption, kind, legend) {
    const fieldset = node("fieldset", { class: "score " + kind });
    fieldset.appendChild(node("legend", {}, legend));
    const current = rating(image.key, caption.label)[kind + "_score"];
    for (const score of kit.scores) {
      const id = kind + "-" + caption.label + "-" + score;
      const input = node("input", { type: "radio", id: id, value: score,
                                    name: kind + "-" + caption.label });
      input.checked = current === score;
      input.addEventListener("change", () => setScore(image.key, caption.label, kind, score));
      const label = node("label", { for: id });
      label.appendChild(input);
      label.appendChild(document.createTextNode(" " + score));
      fieldset.appendChild(label);
    }
    return fieldset;
  }

  function plotFigure(image, plot) {
    const figure = node("figure", { class: "plot" });
    const stack = node("div", { class: "stack" });
    stack.appendChild(node("img", { src: image.src, alt: "", width: image.width,
                                    height: image.height }));
    stack.appendChild(node("img", { class: "overlay", src: plot.overlay,
                                    alt: "attention for " + plot.word,
                                    width: image.width, height: image.height }));
    figure.appendChild(stack);
    figure.appendChild(node("figcaption", {}, plot.word));
    return figure;
  }

  function render() {
    const image = kit.images[state.index];
    const main = document.getElementById("item");
    main.replaceChildren();
    main.appendChild(node("h2", {}, "Image " + (state.index + 1) + " of " + kit.images.length));
    main.appendChild(node("div", { class: "image-name" }, image.name));
    main.appendChild(node("img", { class: "main-image", src: image.src, alt: image.name,
                                   width: image.width, height: image.height }));
    for (const caption of image.captions) {
      const card = node("section", { class: "card", id: "card-" + caption.label });
      card.appendChild(node("h2", {}, "Caption " + caption.label));
      card.appendChild(node("p", { class: "caption" }, caption.text));
      card.appendChild(scoreField(image, caption, KINDS[0][0], KINDS[0][1]));
      const plots = node("div", { class: "plots" });
      for (const plot of caption.words) {
        plots.appendChild(plotFigure(image, plot));
      }
      if (!caption.words.length) {
        plots.appendChild(node("p", { class: "note" }, "This caption has no content words."));
      }
      card.appendChild(plots);
      card.appendChild(scoreField(image, caption, KINDS[1][0], KINDS[1][1]));
      main.appendChild(card);
    }
    document.getElementById("jump").value = String(state.index);
    document.getElementById("prev").disabled = state.index === 0;
    document.getElementById("next").disabled = state.index === kit.images.length - 1;
    updateProgress();
  }

  function go(index) {
    state.index = Math.max(0, Math.min(kit.images.length - 1, index));
    saveState();
    render();
    window.scrollTo(0, 0);
  }

  function exportRatings() {
    const raterId = state.rater_id.trim();
    if (!raterId) {
      setStatus("Enter your rater id before exporting.");
      document.getElementById("rater-id").focus();
      return;
    }
    const ratings = [];
    for (const image of kit.images) {
      for (const caption of image.captions) {
        const entry = rating(image.key, caption.label);
        ratings.push({
          image: image.key, label: caption.label,
          caption_score: Number.isInteger(entry.caption_score) ? entry.caption_score : null,
          attention_score: Number.isInteger(entry.attention_score) ? entry.attention_score : null,
          caption_time: entry.caption_time || null,
          attention_time: entry.attention_time || null,
        });
      }
    }
    const payload = { format: kit.ratings_format, kit_id: kit.kit_id, rater_id: raterId,
                      exported_at: new Date().toISOString(), ratings: ratings };
    const blob = new Blob([JSON.stringify(payload, null, 1)], { type: "application/json" });
    const link = node("a", { href: URL.createObjectURL(blob),
                             download: "ratings_" + kit.kit_id + "_" +
                                       raterId.replace(/[^A-Za-z0-9._-]+/g, "_") + ".json" });
    document.body.appendChild(link);
    link.click();
    link.remove();
    const missing = ratings.filter((r) => r.caption_score === null || r.attention_score === null);
    setStatus("Exported " + ratings.length + " ratings" +
              (missing.length ? " (" + missing.length + " still incomplete)." : "."), true);
  }

  const jump = document.getElementById("jump");
  kit.images.forEach((image, i) => jump.appendChild(node("option", { value: i }, "Image " + (i + 1))));
  jump.addEventListener("change", () => go(Number(jump.value)));
  document.getElementById("prev").addEventListener("click", () => go(state.index - 1));
  document.getElementById("next").addEventListener("click", () => go(state.index + 1));
  document.getElementById("export").addEventListener("click", exportRatings);
  const raterInput = document.getElementById("rater-id");
  raterInput.value = state.rater_id;
  raterInput.addEventListener("input", () => {
    state.rater_id = raterInput.value;
    saveState();
  });
  if (!kit.images.length) {
    setStatus("This kit holds no images.");
    return;
  }
  state.index = Math.max(0, Math.min(kit.images.length - 1, state.index | 0));
  render();
})();
