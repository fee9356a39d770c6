"use strict";(self.rspackChunkpwkernel=self.rspackChunkpwkernel||[]).push([[232],{475(e,r,t){var o=t(601),a=t.n(o),n=t(314),i=(t.n(n))()(a());i.push([e.id,`/* The Pathways sidebar. Colours come from JupyterLab's theme variables (light and dark). */

.pw-Sidebar {
  background: var(--jp-layout-color1);
  color: var(--jp-ui-font-color1);
  font-size: var(--jp-ui-font-size1);
  overflow-y: auto;
  padding: 8px 10px;
  min-width: 220px;
}

.pw-Sidebar h2 {
  font-size: var(--jp-ui-font-size3);
  font-weight: 600;
  margin: 0 0 2px;
}

.pw-Sidebar h3 {
  font-size: var(--jp-ui-font-size1);
  font-weight: 600;
  text-transform: uppercase;
  letter-spacing: 0.04em;
  color: var(--jp-ui-font-color2);
  margin: 12px 0 4px;
}

.pw-connection {
  color: var(--jp-ui-font-color2);
  margin-bottom: 8px;
}

.pw-load {
  margin: 4px 0 8px;
}

.pw-message {
  border-left: 3px solid var(--jp-brand-color1);
  padding: 2px 6px;
  margin: 6px 0;
  word-break: break-all;
}

.pw-message.pw-error {
  border-left-color: var(--jp-error-color1);
  color: var(--jp-error-color1);
}

.pw-controls,
.pw-actions {
  display: flex;
  flex-wrap: wrap;
  gap: 6px 12px;
  align-items: center;
  margin: 4px 0;
}

.pw-island {
  margin-bottom: 8px;
}

.pw-island-load {
  color: var(--jp-ui-font-color2);
  margin: 2px 0 4px;
}

.pw-grid {
  display: grid;
  grid-template-columns: repeat(auto-fill, minmax(52px, 1fr));
  gap: 4px;
}

.pw-device {
  position: relative;
  border: 1px solid var(--jp-border-color2);
  border-radius: 3px;
  padding: 3px 4px;
  min-height: 42px;
  display: flex;
  flex-direction: column;
  overflow: hidden;
  background: var(--jp-layout-color2);
}

.pw-device[data-busy='true'] {
  border-color: var(--jp-brand-color1);
}

/* The utilization bar fills the cell from the bottom, behind the text. */
.pw-bar {
  position: absolute;
  left: 0;
  right: 0;
  bottom: 0;
  background: var(--jp-brand-color3);
  opacity: 0.8;
  transition: height 0.4s ease;
}

.pw-device span {
  position: relative;
  line-height: 1.2;
}

.pw-dev-id {
  font-weight: 600;
}

.pw-dev-util,
.pw-dev-mem {
  font-size: var(--jp-ui-font-size0);
  color: var(--jp-ui-font-color1);
}

.pw-slice,
.pw-run {
  padding: 3px 0;
  border-bottom: 1px solid var(--jp-border-color3);
}

.pw-run {
  display: grid;
  grid-template-columns: 1fr auto;
  grid-template-areas:
    'name cancel'
    'meta cancel';
  align-items: center;
}

.pw-run-name {
  grid-area: name;
  font-weight: 600;
}

.pw-run-meta {
  grid-area: meta;
  color: var(--jp-ui-font-color2);
}

.pw-run[data-state='running'] .pw-run-meta {
  color: var(--jp-success-color1);
}

.pw-cancel {
  grid-area: cancel;
}

.pw-empty {
  color: var(--jp-ui-font-color3);
  font-style: italic;
}

/* A shared device pool: its tenants, the others' recent work, and per device cell a strip of
   how busy each other tenant kept it (hatched in its colour, as in the schedule view). */
.pw-tenant,
.pw-other-work {
  padding: 2px 0;
  border-bottom: 1px solid var(--jp-border-color3);
}

.pw-tenant[data-me='true'] strong {
  color: var(--jp-brand-color1);
}

.pw-tenant-meta,
.pw-recent-head {
  color: var(--jp-ui-font-color2);
}

.pw-recent-head {
  margin-top: 4px;
}

.pw-swatch {
  display: inline-block;
  width: 10px;
  height: 10px;
  margin-right: 4px;
  border: 1px solid var(--jp-border-color1);
  vertical-align: middle;
}

.pw-others {
  position: absolute;
  left: 0;
  right: 0;
  top: 0;
  height: 4px;
  display: flex;
}

.pw-other {
  display: block;
  height: 100%;
}
`,""]),t.d(r,{},{A:i})},314(e){e.exports=function(e){var r=[];return r.toString=function(){return this.map(function(r){var t="",o=void 0!==r[5];return r[4]&&(t+="@supports (".concat(r[4],") {")),r[2]&&(t+="@media ".concat(r[2]," {")),o&&(t+="@layer".concat(r[5].length>0?" ".concat(r[5]):""," {")),t+=e(r),o&&(t+="}"),r[2]&&(t+="}"),r[4]&&(t+="}"),t}).join("")},r.i=function(e,t,o,a,n){"string"==typeof e&&(e=[[null,e,void 0]]);var i={};if(o)for(var p=0;p<this.length;p++){var c=this[p][0];null!=c&&(i[c]=!0)}for(var l=0;l<e.length;l++){var s=[].concat(e[l]);o&&i[s[0]]||(void 0!==n&&(void 0===s[5]||(s[1]="@layer".concat(s[5].length>0?" ".concat(s[5]):""," {").concat(s[1],"}")),s[5]=n),t&&(s[2]&&(s[1]="@media ".concat(s[2]," {").concat(s[1],"}")),s[2]=t),a&&(s[4]?(s[1]="@supports (".concat(s[4],") {").concat(s[1],"}"),s[4]=a):s[4]="".concat(a)),r.push(s))}},r}},601(e){e.exports=function(e){return e[1]}},72(e){var r=[];function t(e){for(var t=-1,o=0;o<r.length;o++)if(r[o].identifier===e){t=o;break}return t}function o(e,o){for(var a={},n=[],i=0;i<e.length;i++){var p=e[i],c=o.base?p[0]+o.base:p[0],l=a[c]||0,s="".concat(c," ").concat(l);a[c]=l+1;var d=t(s),u={css:p[1],media:p[2],sourceMap:p[3],supports:p[4],layer:p[5]};if(-1!==d)r[d].references++,r[d].updater(u);else{var f=function(e,r){var t=r.domAPI(r);return t.update(e),function(r){r?(r.css!==e.css||r.media!==e.media||r.sourceMap!==e.sourceMap||r.supports!==e.supports||r.layer!==e.layer)&&t.update(e=r):t.remove()}}(u,o);o.byIndex=i,r.splice(i,0,{identifier:s,updater:f,references:1})}n.push(s)}return n}e.exports=function(e,a){var n=o(e=e||[],a=a||{});return function(e){e=e||[];for(var i=0;i<n.length;i++){var p=t(n[i]);r[p].references--}for(var c=o(e,a),l=0;l<n.length;l++){var s=t(n[l]);0===r[s].references&&(r[s].updater(),r.splice(s,1))}n=c}}},659(e){var r={};e.exports=function(e,t){var o=function(e){if(void 0===r[e]){var t=document.querySelector(e);if(window.HTMLIFrameElement&&t instanceof window.HTMLIFrameElement)try{t=t.contentDocument.head}catch(e){t=null}r[e]=t}return r[e]}(e);if(!o)throw Error("Couldn't find a style target. This probably means that the value for the 'insert' parameter is invalid.");o.appendChild(t)}},540(e){e.exports=function(e){var r=document.createElement("style");return e.setAttributes(r,e.attributes),e.insert(r,e.options),r}},56(e,r,t){e.exports=function(e){var r=t.nc;r&&e.setAttribute("nonce",r)}},825(e){e.exports=function(e){if("u"<typeof document)return{update:function(){},remove:function(){}};var r=e.insertStyleElement(e);return{update:function(t){var o,a,n;o="",t.supports&&(o+="@supports (".concat(t.supports,") {")),t.media&&(o+="@media ".concat(t.media," {")),(a=void 0!==t.layer)&&(o+="@layer".concat(t.layer.length>0?" ".concat(t.layer):""," {")),o+=t.css,a&&(o+="}"),t.media&&(o+="}"),t.supports&&(o+="}"),(n=t.sourceMap)&&"u">typeof btoa&&(o+="\n/*# sourceMappingURL=data:application/json;base64,".concat(btoa(unescape(encodeURIComponent(JSON.stringify(n))))," */")),e.styleTagTransform(o,r,e.options)},remove:function(){var e;null===(e=r).parentNode||e.parentNode.removeChild(e)}}}},113(e){e.exports=function(e,r){if(r.styleSheet)r.styleSheet.cssText=e;else{for(;r.firstChild;)r.removeChild(r.firstChild);r.appendChild(document.createTextNode(e))}}},579(e,r,t){var o=t(72),a=t.n(o),n=t(825),i=t.n(n),p=t(659),c=t.n(p),l=t(56),s=t.n(l),d=t(540),u=t.n(d),f=t(113),h=t.n(f),m=t(475),v={};v.styleTagTransform=h(),v.setAttributes=s(),v.insert=c().bind(null,"head"),v.domAPI=i(),v.insertStyleElement=u(),a()(m.A,v),m.A&&m.A.locals&&m.A.locals}}]);