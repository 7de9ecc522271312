// "Copy as Markdown / CSV": fetch the estimate's text from this server and put it on the
// clipboard; the link itself downloads it when the clipboard is not available.
document.querySelectorAll("a[data-copy]").forEach(function (link) {
  link.addEventListener("click", function (event) {
    if (!navigator.clipboard) { return; }
    event.preventDefault();
    fetch(link.href).then(function (r) { return r.text(); }).then(function (text) {
      return navigator.clipboard.writeText(text);
    }).then(function () {
      link.setAttribute("data-copied", "yes");
      var note = document.getElementById("copy-status");
      if (note) { note.textContent = "Copied " + link.getAttribute("data-copy") + "."; }
    }).catch(function () { window.location.href = link.href; });
  });
});
