// Attention gallery of captioner: every model's caption of one image side by side, one
// overlay per word. All gallery data (captions, words, names, file names) is inserted with
// textContent or as attribute values, never parsed as HTML (node() of common.js).
"use strict";
(function () {
  const gallery = JSON.parse(document.getElementById("gallery-data").textContent);
  const count = gallery.images.length;
  let current = -1;
  let pinned = false;

  function number(value) {
    return Number(value.toPrecision(3)).toString();
  }

  function legend() {
    document.getElementById("colorbar").src = gallery.colorbar;
    document.getElementById("scale-max").textContent = number(gallery.vmax);
    document.getElementById("scale-text").textContent =
      "one colour scale for every model, word and image: " + (gallery.vmax_given
        ? "vmax " + number(gallery.vmax) + " was given; the largest weight here is " +
          number(gallery.max_weight) + " (heavier weights get the darkest " + gallery.hue + ")"
        : "vmax " + number(gallery.vmax) + " is the largest weight of the gallery");
    const white = gallery.zero_style === "white";
    document.getElementById("zero-swatch").className = "swatch " + (white ? "white" : "clear");
    document.getElementById("zero-text").textContent =
      "zero attention: " + (white ? "painted white" : "no colour, the image shows unchanged") +
      ". Any non-zero weight, however small, is " + gallery.hue + "; darker is more.";
  }

  function stack(image, overlay, word) {
    const box = node("div", { class: "stack" });
    box.appendChild(node("img", { src: image.src, alt: "", width: image.width,
                                  height: image.height }));
    box.appendChild(node("img", { class: "overlay", src: overlay, alt: "attention for " + word,
                                  width: image.width, height: image.height }));
    return box;
  }

  function showLarge(model, caption, word, thumb, pin) {
    const image = gallery.images[current];
    const large = document.getElementById("large");
    document.getElementById("large-image").src = image.src;
    const overlay = document.getElementById("large-overlay");
    overlay.src = word.overlay;
    overlay.alt = "attention for " + word.word;
    const label = document.getElementById("large-caption");
    label.replaceChildren(node("strong", {}, word.word),
                          document.createTextNode(" \u2014 " + model.name + " (" +
                                                  model.mapping + "): " + caption.text));
    const share = pin ? 0.9 : 0.45;
    const width = Math.min(window.innerWidth * share,
                           window.innerHeight * 0.8 * image.width / image.height);
    large.querySelector("figure").style.width = Math.max(64, Math.floor(width)) + "px";
    const box = thumb.getBoundingClientRect();
    large.className = pin ? "pinned" : (box.left + box.width / 2 < window.innerWidth / 2
      ? "right" : "left");
    large.hidden = false;
    pinned = pin;
  }

  function hideLarge() {
    const large = document.getElementById("large");
    large.hidden = true;
    large.className = "";
    pinned = false;
  }

  function wordFigure(model, caption, word) {
    const image = gallery.images[current];
    const figure = node("figure", { class: "word", tabindex: 0, role: "button",
                                    title: "click for a large view" });
    figure.appendChild(stack(image, word.overlay, word.word));
    figure.appendChild(node("figcaption", {}, word.word));
    figure.addEventListener("mouseenter", () => {
      if (!pinned) showLarge(model, caption, word, figure, false);
    });
    figure.addEventListener("mouseleave", () => {
      if (!pinned) hideLarge();
    });
    figure.addEventListener("click", () => showLarge(model, caption, word, figure, true));
    figure.addEventListener("keydown", (event) => {
      if (event.key === "Enter" || event.key === " ") {
        event.preventDefault();
        showLarge(model, caption, word, figure, true);
      }
    });
    return figure;
  }

  function render(index) {
    current = index;
    hideLarge();
    const image = gallery.images[index];
    document.getElementById("position").textContent = "Image " + (index + 1) + " of " + count;
    document.getElementById("prev").disabled = index === 0;
    document.getElementById("next").disabled = index === count - 1;
    const main = document.getElementById("item");
    main.replaceChildren();
    const head = node("section", { class: "image-head" });
    head.appendChild(node("img", { class: "original", src: image.src, alt: image.name,
                                   width: image.width, height: image.height }));
    const title = node("div", {});
    title.appendChild(node("h2", {}, "Image " + (index + 1) + " of " + count));
    title.appendChild(node("div", { class: "image-name" }, image.name));
    if (image.references.length) {
      const references = node("details", { class: "references" });
      references.appendChild(node("summary", {},
                                  "reference captions (" + image.references.length + ")"));
      const list = node("ol", {});
      for (const reference of image.references) list.appendChild(node("li", {}, reference));
      references.appendChild(list);
      title.appendChild(references);
    }
    head.appendChild(title);
    main.appendChild(head);
    const columns = node("div", { class: "models" });
    gallery.models.forEach((model, m) => {
      const caption = image.captions[m];
      const column = node("section", { class: "model" });
      column.appendChild(node("h2", {}, model.name));
      column.appendChild(node("div", { class: "mapping" }, "output attention: " + model.mapping));
      column.appendChild(node("p", { class: "caption" }, caption.text));
      if (caption.cider !== null) {
        column.appendChild(node("div", { class: "score",
                                         title: "CIDEr-D of this caption against the image's " +
                                                "references (IDF of the whole split)" },
                                "CIDEr-D " + caption.cider.toFixed(3)));
      }
      const words = node("div", { class: "words" });
      for (const word of caption.words) {
        words.appendChild(wordFigure(model, caption, word));
      }
      if (!caption.words.length) {
        words.appendChild(node("p", { class: "note" }, "The caption is empty."));
      }
      column.appendChild(words);
      columns.appendChild(column);
    });
    main.appendChild(columns);
  }

  function indexFromHash() {
    const match = /^#(\d+)$/.exec(window.location.hash);
    const n = match ? Number(match[1]) : NaN;
    return n >= 1 && n <= count ? n - 1 : null;
  }

  function go(index) {
    const target = Math.max(0, Math.min(count - 1, index));
    if (target !== current) {
      window.location.hash = String(target + 1);  // hashchange renders it
    }
  }

  function onHash() {
    const index = indexFromHash();
    if (index === null) {
      window.location.replace("#" + (Math.max(current, 0) + 1));
    } else if (index !== current) {
      render(index);
      window.scrollTo(0, 0);
    }
  }

  function onKey(event) {
    if (event.altKey || event.ctrlKey || event.metaKey ||
        /^(INPUT|SELECT|TEXTAREA)$/.test(event.target.tagName)) {
      return;
    }
    const moves = { ArrowRight: 1, j: 1, ArrowLeft: -1, k: -1 };
    if (event.key in moves) {
      event.preventDefault();
      go(current + moves[event.key]);
    } else if (event.key === "Home" || event.key === "End") {
      event.preventDefault();
      go(event.key === "Home" ? 0 : count - 1);
    } else if (event.key === "Escape") {
      hideLarge();
    }
  }

  legend();
  if (!count) {
    document.getElementById("item").textContent = "This gallery holds no images.";
    return;
  }
  document.getElementById("prev").addEventListener("click", () => go(current - 1));
  document.getElementById("next").addEventListener("click", () => go(current + 1));
  document.getElementById("large").addEventListener("click", hideLarge);
  document.addEventListener("keydown", onKey);
  window.addEventListener("hashchange", onHash);
  onHash();
  if (current < 0) {
    render(0);
  }
})();
