// The API reference at /docs: Swagger UI (from the installed swagger-ui-py package, not a
// CDN, so it renders on a machine without internet) over this service's /openapi.json.
window.ui = window.SwaggerUIBundle({url: "/openapi.json", dom_id: "#swagger-ui", deepLinking: true});
