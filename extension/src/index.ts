/**
 * The pwkernel JupyterLab extension: the Pathways sidebar and its commands, and the release of
 * closed live views' plots from the page.
 */

import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';

import { releasePlugin } from './bokehdocs';
import { addCommands } from './commands';
import { PathwaysPanel } from './panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'pwkernel:sidebar',
  description: "The Pathways sidebar: the active notebook's pwkernel controller, live.",
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ICommandPalette, ILayoutRestorer],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    palette: ICommandPalette | null,
    restorer: ILayoutRestorer | null
  ) => {
    const panel = new PathwaysPanel();
    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, panel.id);
    tracker.currentChanged.connect((_, nb) => panel.follow(nb));
    panel.follow(tracker.currentWidget);
    addCommands(app, tracker, panel, palette);
  }
};

export default [plugin, releasePlugin];
