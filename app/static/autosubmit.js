// <select data-autosubmit>: submit its form on change (no inline handlers: the CSP forbids them)
document.querySelectorAll("select[data-autosubmit]").forEach(function (select) {
  select.addEventListener("change", function () { select.form.submit(); });
});
