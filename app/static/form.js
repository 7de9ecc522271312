// The estimate form: choosing a config file, pasting a config or typing a hub id selects that
// model source (no inline handlers: the CSP forbids them).
document.querySelectorAll("[data-source]").forEach(function (field) {
  var pick = function () {
    var radio = document.getElementById(field.getAttribute("data-source"));
    if (radio && (field.type !== "file" || field.files.length)) { radio.checked = true; }
  };
  field.addEventListener("change", pick);
  field.addEventListener("input", pick);
});
